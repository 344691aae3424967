"""The small named messages processes exchange, and their framing.

Children report to the monitor over one shared SOCK_SEQPACKET socket (one datagram per message,
so concurrent senders never interleave). The monitor commands each child over that child's own
socketpair. A file descriptor may ride along with a message (SCM_RIGHTS).
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass, fields
from typing import Literal, TypeAlias, get_args

MAX_MESSAGE = 65536
Role = Literal["mold", "worker"]


# Child -> monitor (on the shared report socket)
@dataclass
class Spawned:
    """A new mold or worker exists; its command socket is attached."""

    role: Role
    pid: int
    generation: int
    nr: int = -1
    slot: int = -1
    age: int = 0


@dataclass
class Ready:
    """The child finished booting: a mold can fork, a worker serves."""

    pid: int
    detail: str = ""
    immortalized: bool = False  # a mold whose heap was made immortal


IMPORTING = "importing the app"  # a fresh mold's first phase
HEAP = "preparing the heap"  # a mold's last phase before Ready: collect, immortalize, freeze


@dataclass
class Starting:
    """The child enters a phase of its start (importing the app, a fork hook...): if it dies
    before it is ready, the monitor can say where."""

    pid: int
    phase: str


@dataclass
class StartFailed:
    """The child could not start: `reason` is the exception's last line; `config_error` means
    the user's APP or config is wrong (exit 2 rather than 3)."""

    pid: int
    phase: str
    reason: str
    config_error: bool = False


@dataclass
class WantsPromotion:
    """A worker reached its refork threshold and is fork-safe."""

    pid: int
    requests: int


@dataclass
class PromotionDeclined:
    """A worker told to become a mold found no moment without a request in its app in time:
    it serves on, and the monitor forgets the mold it was to fork."""

    pid: int
    generation: int
    reason: str


@dataclass
class WantsRetirement:
    """Replace this worker, then stop it: it reached --max-requests, or a request of it passed
    --request-timeout (`cause` names which, for the restart counters)."""

    pid: int
    reason: str
    cause: str = "max_requests"  # | "request_timeout"


@dataclass
class ForkUnsafe:
    """App code called refork.mark_fork_unsafe(): never promote this worker."""

    pid: int
    reason: str


@dataclass
class WorkerExited:
    """Without a subreaper the mold is the workers' parent and forwards their exit."""

    pid: int
    status: int


# Monitor -> child (on the child's own socket)
@dataclass
class SpawnWorker:
    nr: int
    generation: int
    slot: int
    age: int = 0  # the monitor's count of workers asked for: gunicorn's worker.age


@dataclass
class Promote:
    """Fork the next mold from this warm worker at the next safe point."""

    generation: int


@dataclass
class Stop:
    graceful: bool = True
    websockets: float = 0.0  # seconds a retired worker may serve its open WebSockets on (0: close them)


@dataclass
class ReopenLogs:
    pass


# What a child may report, and what the monitor may command.
Report: TypeAlias = (
    Spawned
    | Starting
    | Ready
    | StartFailed
    | WantsPromotion
    | PromotionDeclined
    | WantsRetirement
    | ForkUnsafe
    | WorkerExited
)
Command: TypeAlias = SpawnWorker | Promote | Stop | ReopenLogs
Message: TypeAlias = Report | Command
MESSAGE_TYPES: dict[str, type[Message]] = {cls.__name__: cls for cls in get_args(Message)}


def last_line(error: BaseException) -> str:
    """An exception as the last line of its traceback (a StartFailed reason)."""
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def encode(message: Message) -> bytes:
    return json.dumps([type(message).__name__, asdict(message)], separators=(",", ":")).encode()


def decode(data: bytes) -> Message:
    name, values = json.loads(data)
    cls = MESSAGE_TYPES[name]
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in known})


def send(sock: socket.socket, message: Message, fd: int | None = None) -> None:
    """Send one message; raises OSError if the peer is gone."""
    data = encode(message)
    if fd is None:
        sock.send(data)
    else:
        socket.send_fds(sock, [data], [fd])


def receive(sock: socket.socket) -> tuple[Message, socket.socket | None] | None:
    """Receive one message and its attached socket; None on EOF. Raises BlockingIOError if none."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
    if not data:
        for fd in fds:
            _close_fd(fd)
        return None
    attached = socket.socket(fileno=fds[0]) if fds else None
    return decode(data), attached


def _close_fd(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass


def command_pair() -> tuple[socket.socket, socket.socket]:
    """A child's command channel: (monitor end, child end)."""
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
