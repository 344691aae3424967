"""What a fork would copy that must not be shared: open connections and running threads.

A connection opened while the app loads (a database, a cache, an HTTP client) is inherited by
every worker: they all read and write one TCP stream. A thread running in the mold is not
copied at all, but the locks it held are, so a worker can deadlock on them. The mold looks for
both right before it forks; while the app is imported and warmed, `LoadTracer` remembers where
each connection and thread was made, so the report names the line to fix.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import socket
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from refork.errors import ConfigError

log = logging.getLogger("refork")
_REFORK_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = tuple({sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib")})
_LIBRARIES = tuple({sysconfig.get_paths()[k] + os.sep for k in ("purelib", "platlib")})


def _is_library(filename: str) -> bool:
    return filename.startswith(_LIBRARIES)


def _is_plumbing(filename: str) -> bool:
    """refork itself and the standard library: never the line to fix."""
    return filename.startswith(_REFORK_DIR) or (filename.startswith(_STDLIB) and not _is_library(filename))


@dataclass(frozen=True)
class Hazard:
    what: str  # "a connection to 127.0.0.1:5432 (fd 7)", "a thread 'poller'"
    origin: str | None = None  # "myapp/db.py:12 in connect" when traced
    fd: int | None = None  # of a connection

    def __str__(self) -> str:
        return f"{self.what}, made at {self.origin}" if self.origin else self.what


def _caller() -> str | None:
    """Where the app made this: its two innermost own frames, and the library line if one did it."""
    frames = [f for f in traceback.extract_stack()[:-2] if not _is_plumbing(f.filename)]
    if not frames:
        return None
    own = [f for f in frames if not _is_library(f.filename)][-2:]
    where = " <- ".join(f"{f.filename}:{f.lineno} in {f.name}" for f in reversed(own))
    innermost = frames[-1]
    if not own or own[-1] is not innermost:
        library = f"{innermost.filename}:{innermost.lineno} in {innermost.name}"
        where = f"{where} (through {library})" if where else library
    return where


# Drivers that connect from C (libpq): socket.connect never sees them, so their Python entry point
# (psycopg2.connect, psycopg.Connection.connect) is wrapped while tracing, as soon as imported.
C_DRIVERS = ("psycopg2", "psycopg")


class _OnImport(importlib.abc.MetaPathFinder):
    """Calls `imported(module)` right after one of `names` is imported (while it is installed)."""

    def __init__(self, names: set[str], imported: Callable[[Any], None]) -> None:
        self.names = names
        self.imported = imported
        self._finding = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenCall(spec.loader, self.imported)
        return spec


class _ThenCall(importlib.abc.Loader):
    """A module's own loader, and a call once it has executed."""

    def __init__(self, loader: Any, then: Callable[[Any], None]) -> None:
        self._loader = loader
        self._then = then

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package...
        return getattr(self._loader, name)


class LoadTracer:
    """While active, remember where sockets connect and threads start (fd / thread -> line).

    Only the mold's import and warm-up run under it, so the patched calls cost nothing later.
    """

    def __init__(self) -> None:
        self.connections: dict[int, str] = {}
        self.threads: dict[int, str] = {}  # id(Thread) -> origin
        self._saved: list[tuple[Any, str, Any]] = []
        self._finder: _OnImport | None = None

    def __enter__(self) -> LoadTracer:
        tracer = self
        connect, connect_ex, start = socket.socket.connect, socket.socket.connect_ex, threading.Thread.start

        def traced_connect(sock: socket.socket, address: Any) -> None:
            tracer._note_connection(sock)
            return connect(sock, address)

        def traced_connect_ex(sock: socket.socket, address: Any) -> int:
            tracer._note_connection(sock)
            return connect_ex(sock, address)

        def traced_start(thread: threading.Thread) -> None:
            origin = _caller()
            if origin:
                tracer.threads[id(thread)] = origin
            return start(thread)

        for owner, name, patched in (
            (socket.socket, "connect", traced_connect),
            (socket.socket, "connect_ex", traced_connect_ex),
            (threading.Thread, "start", traced_start),
        ):
            self._patch(owner, name, patched)
        for module in [sys.modules[name] for name in C_DRIVERS if name in sys.modules]:
            self._trace_driver(module)
        self._finder = _OnImport(set(C_DRIVERS), self._trace_driver)
        sys.meta_path.insert(0, self._finder)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def _patch(self, owner: Any, name: str, patched: Any) -> None:
        original = vars(owner)[name] if name in vars(owner) else getattr(owner, name)  # a classmethod as is
        self._saved.append((owner, name, original))
        setattr(owner, name, patched)

    def _trace_driver(self, module: Any) -> None:
        """Wrap the Python entry point of a driver that connects from C (libpq), to note the line."""
        tracer = self

        def noted(conn: Any) -> Any:
            origin = _caller()
            if origin:
                with contextlib.suppress(Exception):
                    tracer.connections[int(conn.fileno())] = origin
            return conn

        if module.__name__ == "psycopg2":
            connect = module.connect

            def psycopg2_connect(*args: Any, **kwargs: Any) -> Any:
                return noted(connect(*args, **kwargs))

            self._patch(module, "connect", psycopg2_connect)
        elif module.__name__ == "psycopg":
            cls = module.Connection
            function = cls.__dict__["connect"].__func__

            def psycopg_connect(klass: Any, *args: Any, **kwargs: Any) -> Any:
                return noted(function(klass, *args, **kwargs))

            self._patch(cls, "connect", classmethod(psycopg_connect))
            self._patch(module, "connect", cls.connect)

    def _note_connection(self, sock: socket.socket) -> None:
        origin = _caller()
        if origin:
            self.connections[sock.fileno()] = origin


def tracing(mode: str) -> contextlib.AbstractContextManager[LoadTracer | None]:
    """A LoadTracer for --fork-safety warn|strict; nothing (None) for off."""
    return LoadTracer() if mode != "off" else contextlib.nullcontext()


def _stream_ends(fd: int) -> tuple[int, Any, Any] | None:
    """(family, local, peer) of a connected stream socket at fd; None for anything else."""
    try:
        if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
            return None
        sock = socket.socket(fileno=fd)  # borrowed: detached below, never closed
    except OSError:
        return None
    try:
        if sock.type != socket.SOCK_STREAM:
            return None
        return sock.family, sock.getsockname(), sock.getpeername()
    except OSError:
        return None  # listening or not connected
    finally:
        sock.detach()


def _connections(ignore: Iterable[int]) -> Iterator[tuple[int, int, Any, Any]]:
    ignored = {0, 1, 2, *ignore}  # stdio: journald's stdout, say, is a connected socket
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        fd = int(name)
        ends = _stream_ends(fd) if fd not in ignored else None
        if ends is not None:
            yield (fd, *ends)


def open_connections(ignore: Iterable[int] = (), tracer: LoadTracer | None = None) -> list[Hazard]:
    """Connected TCP and named Unix stream sockets among this process's fds, minus `ignore`."""
    hazards = []
    for fd, family, _, peer in _connections(ignore):
        if family == socket.AF_UNIX:
            if not peer:
                continue  # an unnamed socketpair or an accepted client: plumbing, not a server
            where = peer
        else:
            where = f"[{peer[0]}]:{peer[1]}" if family == socket.AF_INET6 else f"{peer[0]}:{peer[1]}"
        origin = tracer.connections.get(fd) if tracer else None
        hazards.append(Hazard(f"a connection to {where} (fd {fd})", origin, fd))
    return hazards


def client_connections(listeners: Iterable[socket.socket], ignore: Iterable[int] = ()) -> list[Hazard]:
    """Connections accepted on `listeners` (a promoted worker's HTTP clients), by local address."""
    ports, paths = set(), set()
    for sock in listeners:
        if sock.family == socket.AF_UNIX:
            paths.add(sock.getsockname())
        elif sock.family in (socket.AF_INET, socket.AF_INET6):
            ports.add(sock.getsockname()[1])
    return [
        Hazard(f"an HTTP client (fd {fd})", fd=fd)
        for fd, family, local, _ in _connections(ignore)
        if (local in paths if family == socket.AF_UNIX else local[1] in ports)
    ]


def cut(connections: list[Hazard]) -> None:
    """Swap each connection's fd for an unconnected socket: this process's copy goes dead.

    The peer sees nothing (the process it came from still holds the connection); code here that
    uses it gets an error (ENOTCONN, EPIPE) and reconnects, instead of sharing the stream.
    """
    for hazard in connections:
        if hazard.fd is None:
            continue
        with socket.socket() as dead:
            os.dup2(dead.fileno(), hazard.fd)


def running_threads(tracer: LoadTracer | None = None) -> list[Hazard]:
    """Threads other than the calling one, including native threads Python did not start."""
    me = threading.current_thread()
    hazards = []
    known = {threading.get_native_id()}
    for thread in threading.enumerate():
        if thread is me or not thread.is_alive():
            continue
        if thread.native_id is not None:
            known.add(thread.native_id)
        origin = tracer.threads.get(id(thread)) if tracer else None
        hazards.append(Hazard(f"a thread {thread.name!r}{' (daemon)' if thread.daemon else ''}", origin))
    try:
        native = {int(t) for t in os.listdir("/proc/self/task")} - known
    except OSError:
        native = set()
    if native:
        hazards.append(Hazard(f"{len(native)} native thread(s) not started by Python (a C extension?)"))
    return hazards


ADVICE = (
    "close connections before the fork (a @refork.before_fork function) or make each client per worker "
    "(refork.per_process(lambda: connect(...))); start threads in a @refork.after_fork function; "
    "see docs/fork-safety.md"
)


def inspect(ignore: Iterable[int] = (), tracer: LoadTracer | None = None) -> list[Hazard]:
    """Everything a fork of this process would share or lose: connections, then threads."""
    return open_connections(ignore, tracer) + running_threads(tracer)


INHERITED = "every worker forked from {who} inherits these; " + ADVICE


def judge(hazards: list[Hazard], mode: str, who: str, consequence: str = INHERITED) -> None:
    """Log each hazard and what follows; under --fork-safety strict, raise ConfigError instead."""
    if not hazards or mode == "off":
        return
    for hazard in hazards:
        log.warning("fork safety: %s holds %s", who, hazard)
    if mode == "strict":
        raise ConfigError(
            f"fork safety: {who} holds {len(hazards)} connection(s) or thread(s) a fork must not "
            f"copy, first {hazards[0]}; {ADVICE} (--fork-safety strict)"
        )
    log.warning("fork safety: %s", consequence.format(who=who))
