"""The control socket: `refork status`, `refork reload` and friends talk to the monitor through it.

One JSON object per line each way over a Unix stream socket; requests are tiny and answered in
the monitor's loop, so the monitor stays single-threaded.

Both ends check who is on the other side, because a socket path is only a name: another local
user who binds it first would otherwise receive root's `refork reload` and answer it. The
default path is in a directory only our uid can write; the server refuses a location another
user owns or can replace; each side asks the kernel for its peer's uid (SO_PEERCRED) and talks
only to its own uid or root.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import logging
import os
import pwd
import re
import socket
import stat
import struct
from typing import Any, Protocol

from refork.config import Config
from refork.errors import ConfigError

log = logging.getLogger("refork")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_ANSWER = 4 << 20  # a status table of thousands of processes is well under this
MAX_REQUEST = 65536  # a request line (commands are a few bytes)
MAX_CLIENTS = 64  # connections served at once; more wait in the listen backlog
CLIENT_TIMEOUT = 5.0  # seconds to send a request, and to take its answer
COMMANDS = ("status", "refork", "reload", "ttin", "ttou")


class ControlError(Exception):
    """The control socket could not be trusted or understood: one line for the user."""


def default_dir() -> str:
    """`$XDG_RUNTIME_DIR` (private to the user by the XDG spec, checked by the server), else
    `refork-<uid>` under the temp directory, a directory the server creates with mode 0700."""
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        return runtime
    import tempfile  # here: the monitor needs it only without XDG_RUNTIME_DIR (and not its shutil, random)

    return os.path.join(tempfile.gettempdir(), f"refork-{os.geteuid()}")


def default_path(proc_name: str, bind: str | None = None) -> str:
    """Where the control socket lives unless --control-socket says otherwise: one per server,
    named by its --name and first --bind address (`refork-127.0.0.1:8000.ctl`), so two servers of
    one user never share one. Computing it has no side effects: the client never creates anything.
    """
    if bind is None:
        return os.path.join(default_dir(), f"{proc_name}.ctl")
    return os.path.join(default_dir(), f"{proc_name}-{_slug(bind)}.ctl")


def _slug(bind: str) -> str:
    """A bind address as a file name: `unix:/run/app.sock` -> `unix:_run_app.sock`."""
    return re.sub(r"[^\w.:\[\]-]", "_", bind)[-80:]


def servers(proc_name: str) -> list[str]:
    """The default control sockets of this user's servers named `proc_name` that answer a
    connect (a crashed server's file is skipped), newest first."""
    found = glob.glob(os.path.join(glob.escape(default_dir()), f"{glob.escape(proc_name)}-*.ctl"))
    found += [p for p in [default_path(proc_name)] if os.path.exists(p)]
    live = []
    for path in found:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            live.append(path)
        except OSError:
            pass
        finally:
            probe.close()
    return sorted(live, key=lambda p: os.stat(p).st_mtime if os.path.exists(p) else 0, reverse=True)


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def trusted_uid(uid: int) -> bool:
    """Our own uid, or root (who can do anything to us anyway)."""
    return uid in (os.geteuid(), 0)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process on the other end of a connected unix socket, from the kernel."""
    _pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(uid)


def check_private_dir(path: str, *, create: bool) -> None:
    """Refuse a directory for the default socket unless only we can write it.

    `create`: make it first (mode 0700) and demand exactly that; otherwise (`$XDG_RUNTIME_DIR`)
    it must be ours and not writable by group or others. lstat, so a symlink planted by someone
    else is refused rather than followed.
    """
    where = f"control socket directory {path}"
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        st = os.lstat(path)
    except OSError as e:
        raise ConfigError(f"{where}: {e.strerror}; set --control-socket") from None
    me = os.geteuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{where} is not a directory (a symlink?); remove it or set --control-socket")
    if st.st_uid != me:
        raise ConfigError(
            f"{where} is owned by {_who(st.st_uid)}, not by {_who(me)}: another user may have made it "
            "to intercept `refork` commands; remove it or set --control-socket"
        )
    loose = st.st_mode & (0o077 if create else 0o022)
    if loose:
        raise ConfigError(
            f"{where} has mode {stat.S_IMODE(st.st_mode):04o}: other users could replace the socket; "
            f"make it {'0700' if create else 'not group/world-writable'} or set --control-socket"
        )


def check_location(path: str, *, explicit: bool) -> None:
    """Refuse a socket path another user owns or can replace (ConfigError: one line, exit 2).

    The default path's directory must be private (check_private_dir); an explicit path's
    directory must not be world-writable without the sticky bit. An existing file at the path
    must be a socket of ours: it is about to be unlinked.
    """
    directory = os.path.dirname(os.path.abspath(path))
    if not explicit:
        check_private_dir(directory, create=not os.environ.get("XDG_RUNTIME_DIR"))
    else:
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(directory).st_mode
            if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
                raise ConfigError(
                    f"--control-socket {path}: {directory} is writable by every user and not sticky, "
                    "so another user could replace the socket; choose a private directory"
                )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(
            f"control socket {path} exists and is not a socket; remove it or choose another path"
        )
    me = os.geteuid()
    if st.st_uid != me:
        raise ConfigError(
            f"control socket {path} is owned by {_who(st.st_uid)}, not by {_who(me)}: another user "
            "bound it first; remove it or set --control-socket"
        )


class Commands(Protocol):
    """What the control socket asks of the monitor (refork.process.monitor.Monitor)."""

    def status(self) -> dict[str, Any]: ...
    def refork_now(self) -> bool: ...
    def reload(self) -> str | None: ...
    def set_worker_count(self, count: int) -> None: ...
    @property
    def target_workers(self) -> int: ...


class _Client:
    """One control connection: what it sent so far, and what it is still owed."""

    __slots__ = ("sock", "since", "buffer", "out", "stranger")

    def __init__(self, sock: socket.socket, now: float, stranger: bool) -> None:
        self.sock = sock
        self.since = now  # when it connected (reading), or when its answer was ready (writing)
        self.buffer = b""
        self.out: bytes | None = None  # the answer being written
        self.stranger = stranger  # gets "permission denied"


class ControlServer:
    """The monitor's side: non-blocking, bounded, and never its end.

    A request is one line of at most MAX_REQUEST bytes, read within CLIENT_TIMEOUT of the
    connect; its answer is written as the client takes it, within CLIENT_TIMEOUT; at most
    MAX_CLIENTS connections at once (more wait in the backlog); accept() failing for want of
    descriptors or memory pauses accepting for a second. Whatever a client sends (random bytes,
    JSON nested ten thousand deep, a command whose handler raises) gets an error answer, and
    the monitor carries on: it is the one process that must not die.
    """

    def __init__(self, listener: socket.socket | None, path: str | None, commands: Commands) -> None:
        self.listener = listener
        self.path = path
        self.commands = commands
        self.clients: dict[socket.socket, _Client] = {}
        self.paused_until = 0.0  # accept() failed for want of resources: not before then
        self.served: dict[str, int] = {}  # commands answered, by name (the metrics)

    @classmethod
    def open(cls, config: Config, commands: Commands) -> ControlServer:
        """Bind the control socket; ConfigError when its location is not safe (see check_location)."""
        if config.control_socket == "off":
            return cls(None, None, commands)
        path = config.control_socket or default_path(config.proc_name, config.bind[0])
        check_location(path, explicit=bool(config.control_socket))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.exists(path):
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    probe.connect(path)
                    probe.close()
                    log.warning(
                        "control socket %s is in use by another refork; `refork status` "
                        "will not reach this one (set --control-socket)",
                        path,
                    )
                    listener.close()
                    return cls(None, None, commands)
                except OSError:
                    probe.close()
                    os.unlink(path)
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(16)
            listener.setblocking(False)
        except OSError as e:
            listener.close()
            log.warning("control socket %s unavailable: %s", path, e.strerror)
            return cls(None, None, commands)
        return cls(listener, path, commands)

    def sockets(self) -> list[socket.socket]:
        """Every socket it owns (a forked child closes them all)."""
        return ([self.listener] if self.listener else []) + list(self.clients)

    def readers(self, now: float) -> list[socket.socket]:
        """What to wait on for reading: the listener while it may accept, clients still sending."""
        readers = [c.sock for c in self.clients.values() if c.out is None]
        if self.listener is not None and now >= self.paused_until and len(self.clients) < MAX_CLIENTS:
            readers.append(self.listener)
        return readers

    def writers(self) -> list[socket.socket]:
        return [c.sock for c in self.clients.values() if c.out is not None]

    def on_readable(self, sock: socket.socket, now: float) -> None:
        if sock is self.listener:
            self._accept(now)
            return
        client = self.clients.get(sock)
        if client is None or client.out is not None:
            return
        try:
            data = sock.recv(MAX_REQUEST + 1)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        client.buffer += data
        if data and b"\n" not in client.buffer and len(client.buffer) <= MAX_REQUEST:
            return
        if b"\n" not in client.buffer and len(client.buffer) > MAX_REQUEST:
            reply = {"ok": False, "error": f"bad request: longer than {MAX_REQUEST} bytes"}
        elif client.stranger:
            reply = {"ok": False, "error": "permission denied: not the server's user or root"}
        else:  # may fork a mold: the socket must still be listed for the child to close it
            reply = self._answer(client.buffer.split(b"\n", 1)[0])
        client.out = json.dumps(reply).encode() + b"\n"
        client.since = now
        self.on_writable(sock)

    def on_writable(self, sock: socket.socket) -> None:
        client = self.clients.get(sock)
        if client is None or client.out is None:
            return
        try:
            sent = sock.send(client.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(client.out)  # the client left: nothing more to say
        client.out = client.out[sent:]
        if not client.out:
            self._drop(client)

    def sweep(self, now: float) -> None:
        """Close what took longer than CLIENT_TIMEOUT to ask, or to take its answer."""
        for client in [c for c in self.clients.values() if now - c.since > CLIENT_TIMEOUT]:
            self._drop(client)

    def _accept(self, now: float) -> None:
        assert self.listener is not None
        for _ in range(MAX_CLIENTS - len(self.clients)):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # out of descriptors or memory: try again later, never spin
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                log.error("control socket: accept() failed: %s; pausing it for a second", e)
                self.paused_until = now + 1.0
                return
            sock.setblocking(False)
            self.clients[sock] = _Client(sock, now, self._is_stranger(sock))

    def _drop(self, client: _Client) -> None:
        self.clients.pop(client.sock, None)
        client.sock.close()

    @staticmethod
    def _is_stranger(client: socket.socket) -> bool:
        """Every command, status included, is for our own uid or root only (like the 0600 file).

        A stranger's request is still read, then answered "permission denied": a reply sent
        before the request arrived would make the client's send fail instead.
        """
        try:
            uid = peer_uid(client)
        except OSError:
            uid = -1
        if trusted_uid(uid):
            return False
        log.warning("control socket: refused a client running as %s", _who(uid))
        return True

    def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line or b"{}")
        except (ValueError, RecursionError, MemoryError):
            request = None
        if not isinstance(request, dict) or not isinstance(command := request.get("command", "status"), str):
            return {"ok": False, "error": "bad request: send one JSON object per line"}
        counted = command if command in COMMANDS else "unknown"
        self.served[counted] = self.served.get(counted, 0) + 1
        try:
            return self._run(command)
        except Exception as e:  # a command's failure is its answer, never the monitor's end
            log.exception("control socket: the %s command failed", command)
            return {"ok": False, "error": f"{command} failed: {type(e).__name__}: {e}"}

    def _run(self, command: str) -> dict[str, Any]:
        if command == "status":
            return {"ok": True, **self.commands.status()}
        if command == "refork":
            started = self.commands.refork_now()
            return {"ok": started, **({} if started else {"error": "no promotable worker (see the log)"})}
        if command == "reload":
            refused = self.commands.reload()
            if refused:
                return {"ok": False, "error": f"reload refused: {refused}"}
            message = "reloading: a new mold is importing the app; `refork status` shows the rollout"
            return {"ok": True, "message": message}
        if command in ("ttin", "ttou"):
            delta = 1 if command == "ttin" else -1
            self.commands.set_worker_count(self.commands.target_workers + delta)
            return {"ok": True, "workers": self.commands.target_workers}
        return {"ok": False, "error": f"unknown command {command!r}"}

    def close(self) -> None:
        for client in list(self.clients.values()):
            self._drop(client)
        if self.listener is not None:
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # type: ignore[arg-type]


def request(path: str, command: str, timeout: float = 10.0) -> dict[str, Any]:
    """Client side: send one command, return the monitor's answer.

    ControlError when the socket is served by another user (not ours, not root: whoever bound
    the path first is not to be told anything nor believed) or the answer is not a refork one.
    OSError as connect() raises it.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        uid = peer_uid(sock)
        if not trusted_uid(uid):
            me = os.geteuid()
            raise ControlError(
                f"{path} is served by {_who(uid)}, not by {'root' if me == 0 else _who(me) + ' or root'}: "
                "not trusting it (another user may have bound the path first)"
            )
        sock.sendall(json.dumps({"command": command}).encode() + b"\n")
        chunks = []
        size = 0
        while chunk := sock.recv(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                raise ControlError(f"{path}: the answer is larger than {MAX_ANSWER} bytes")
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ControlError(f"{path}: not a refork control socket (the answer is not a JSON object)")
    return answer
