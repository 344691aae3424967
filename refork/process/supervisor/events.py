"""What the supervisor core is told (events) and what it asks for (actions).

Small frozen dataclasses, like h11's events: the monitor turns signals, reports, exits, control
commands and the passing of time into events, and carries out the actions the core returns.
Children's reports (refork.process.messages: Spawned, Starting, Ready, StartFailed, WantsRetirement,
WantsPromotion, PromotionDeclined, ForkUnsafe) are events as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from refork.config import Config
from refork.memory.accounting import ProcessMemory
from refork.process import messages

StopMode = Literal["graceful", "fast"]
Milestone = Literal["ready", "reloading", "reloaded", "stopping"]


# -- events: the world, as the monitor saw it ---------------------------------------------------
@dataclass(frozen=True)
class Boot:
    """The monitor is set up (listeners bound, slots page mapped): start the first mold."""


@dataclass(frozen=True)
class SlotReading:
    """One slot of the shared page as the monitor read it."""

    owner: int  # the pid that claimed it
    deadline: float  # monotonic seconds, 0 = none
    requests: int
    websockets: int = 0  # open WebSockets
    busy: int = 0  # requests in the app (in flight, not waiting on their client)
    overdue: int = 0  # requests past --request-timeout
    threads: int = 0  # its app threads (WSGI --threads; 0 for ASGI)


@dataclass(frozen=True)
class Tick:
    """Time passed (the loop woke): enforce deadlines, keep the worker count, roll out, recycle.

    `slots` is the shared page as read just now, by slot index, for the slots of known workers.
    """

    slots: Mapping[int, SlotReading] = field(default_factory=dict)


@dataclass(frozen=True)
class ChildExited:
    """waitpid reaped it (or, without a subreaper, the mold forwarded a worker's exit)."""

    pid: int
    status: int  # the raw wait status


@dataclass(frozen=True)
class MoldForked:
    """The monitor carried out ForkMold: the new mold's pid."""

    pid: int


@dataclass(frozen=True)
class SendFailed:
    """A Send could not be delivered: no command socket yet, or the child is gone."""

    pid: int
    message: object


@dataclass(frozen=True)
class StopRequested:
    """SIGTERM (graceful) or SIGINT/SIGQUIT (fast)."""

    mode: StopMode


@dataclass(frozen=True)
class ReloadRequested:
    """HUP or `refork reload`. The core answers RereadConfig, or Refused."""


@dataclass(frozen=True)
class ConfigReread:
    """The result of RereadConfig: the config as it reads now (None: no source to re-read), or
    why it could not be built (a ConfigError, or the config file raising, in one line)."""

    config: Config | None = None
    error: str | None = None


@dataclass(frozen=True)
class FilesChanged:
    """--reload: the watcher saw these *.py files change."""

    paths: tuple[str, ...]


@dataclass(frozen=True)
class ReforkRequested:
    """USR2 or `refork refork`: promote the warmest worker; `slots` as read just now."""

    slots: Mapping[int, SlotReading] = field(default_factory=dict)


@dataclass(frozen=True)
class ReopenLogsRequested:
    """USR1: log rotation."""


@dataclass(frozen=True)
class SetWorkerCount:
    """TTIN/TTOU or `refork ttin`/`ttou`: the count wanted (clamped by the core)."""

    count: int


@dataclass(frozen=True)
class MemorySampled:
    """smaps_rollup readings by pid (None: the process is gone). `check_limit` is False for the
    readings `refork status` takes, which only refresh the numbers shown."""

    readings: Mapping[int, ProcessMemory | None]
    check_limit: bool = True


@dataclass(frozen=True)
class ImmortalizationUnsafe:
    """The monitor's canary died immortalizing a heap (refork.process.monitor_heap): no mold
    may immortalize on this interpreter."""

    detail: str


@dataclass(frozen=True)
class HandshakesCounted:
    """TCP handshakes still under way on the sealed listeners (see CloseListeners)."""

    pending: int


Report = (
    messages.Spawned
    | messages.Starting
    | messages.Ready
    | messages.StartFailed
    | messages.WantsRetirement
    | messages.WantsPromotion
    | messages.PromotionDeclined
    | messages.ForkUnsafe
)
Event = (
    Boot
    | ImmortalizationUnsafe
    | Tick
    | Report
    | ChildExited
    | MoldForked
    | SendFailed
    | StopRequested
    | ReloadRequested
    | ConfigReread
    | FilesChanged
    | ReforkRequested
    | ReopenLogsRequested
    | SetWorkerCount
    | MemorySampled
    | HandshakesCounted
)


# -- actions: what the core wants done ----------------------------------------------------------
@dataclass(frozen=True)
class ForkMold:
    """Fork a fresh mold that imports the app; with `config` (a HUP), the child runs with it.
    The monitor answers with MoldForked."""

    generation: int
    config: Config | None = None


@dataclass(frozen=True)
class Send:
    """A command on the child's own socket (SpawnWorker, Stop, Promote, ReopenLogs). The monitor
    answers SendFailed if it could not be delivered."""

    pid: int
    message: messages.Command


@dataclass(frozen=True)
class Signal:
    """os.kill(pid, signum); a child already gone is no error."""

    pid: int
    signum: int


@dataclass(frozen=True)
class ReleaseSlot:
    """Clear a slot of the shared page: its worker is gone."""

    slot: int


@dataclass(frozen=True)
class CloseChannel:
    """Close the monitor's end of a child's command socket (it exited, or was never expected)."""

    pid: int


@dataclass(frozen=True)
class RunHook:
    """Run a config-file hook in the monitor with (server, *extra) (child_exit: the child's facts
    as a dict, made its `worker` object by the monitor); its exception is logged, never fatal."""

    name: str
    config: Config
    extra: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Log:
    """One line for the refork logger, already formatted."""

    level: int
    text: str


@dataclass(frozen=True)
class AdoptConfig:
    """A reloaded mold is ready: its config is now the monitor's (and logging's) and its children's."""

    config: Config


@dataclass(frozen=True)
class RereadConfig:
    """Build the config again from the same flags, file and environment; answer ConfigReread."""


@dataclass(frozen=True)
class SampleMemory:
    """Read smaps_rollup for these pids; answer MemorySampled."""

    pids: tuple[int, ...]


@dataclass(frozen=True)
class ReopenLogFiles:
    """Reopen the monitor's own log files (USR1)."""


@dataclass(frozen=True)
class PrintError:
    """One line on stderr for the user (why the server cannot start), printed as the monitor's
    last words when it exits, after its log lines."""

    text: str


@dataclass(frozen=True)
class Refused:
    """A requested reload or refork did not start, and why (the control socket's answer)."""

    reason: str


@dataclass(frozen=True)
class Announce:
    """A milestone of the server's life for the outside world: "ready" (--ready-when met: readiness
    on, systemd READY=1), "reloading" / "reloaded" (a HUP's new mold: RELOADING=1, READY=1),
    "stopping" (a TERM: readiness off, STOPPING=1)."""

    milestone: Milestone


@dataclass(frozen=True)
class CloseListeners:
    """A graceful stop begins: the monitor seals the listeners it bound (no new connection) and
    closes its copies, so the last process to hold them is a worker that takes the backlog first
    (nothing queued is reset). Answered with HandshakesCounted: workers stop once it is 0."""


@dataclass(frozen=True)
class CountHandshakes:
    """Count again the handshakes under way on the sealed listeners; answer HandshakesCounted."""


@dataclass(frozen=True)
class Exit:
    """Every child is gone after a stop: the monitor shuts down with this status."""

    code: int


Action = (
    ForkMold
    | Send
    | Signal
    | ReleaseSlot
    | CloseChannel
    | RunHook
    | Log
    | AdoptConfig
    | RereadConfig
    | SampleMemory
    | ReopenLogFiles
    | PrintError
    | Refused
    | Announce
    | CloseListeners
    | CountHandshakes
    | Exit
)
