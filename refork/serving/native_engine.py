"""The native WSGI loop with one app thread: refork._native.Engine serves the request path.

The engine (Rust, native/src/engine.rs) runs the hot loop: accept, read, parse, environ, the app
call and a list body written in one send, for every plain connection. This loop stays the outer
one and keeps everything else, unchanged from the Python loop it extends
(:class:`refork.serving.native._NativeLoop`): the control socket, TLS listeners, ticks, the drain,
safe points, and every connection or response the engine does not take, which it hands over
here with its unconsumed bytes (:meth:`_adopt`) or mid-response (:meth:`_exchange`,
:meth:`_finish_slow`). Once such a connection is between two requests again, with nothing
half-read or half-written, it goes back to the engine (:meth:`NativeHost._idle_again`).

The engine starts no thread and exists only in a serving worker: a mold has none, and a
promoted worker's child forgets the engine's connections at the safe point.
"""

from __future__ import annotations

import io
import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

from refork import deadlines
from refork.config import Config
from refork.http.body import EMPTY_INPUT, InputStream
from refork.http.events import ParseError, Request
from refork.http.response import ResponseFramer, simple_response
from refork.serving.connection import Phase, log_access
from refork.serving.contract import WorkerControl
from refork.serving.native import NativeEnvironBuilder, _native, _NativeLoop
from refork.serving.outbox import Outbox
from refork.serving.threaded_conn import NO_EVENTS, Conn, Step, Writing
from refork.wsgi import EnvironBuilder, Streaming
from refork.wsgi import response as wsgi_response
from refork.wsgi.files import FileWrapper
from refork.wsgi.response import _Exchange, continue_wsgi

log = logging.getLogger("refork")


def _memory_input(data: bytes) -> InputStream:
    return InputStream(io.BytesIO(data), len(data))


def refs() -> dict[str, Any]:
    """What the engine calls in refork (its own copy of nothing: the same caches and checks)."""
    return {
        "current": deadlines.current,
        "request_cls": Request,
        "make_input": _memory_input,
        "empty_input": EMPTY_INPUT,
        "status_cache": wsgi_response._STATUS_CACHE,
        "header_cache": wsgi_response._HEADER_CACHE,
        "check_status": wsgi_response._check_status,
        "check_header": wsgi_response._check_header,
        "prefetched": wsgi_response.Prefetched,
        "file_wrapper": FileWrapper,
        "closing_failed": wsgi_response.closing_failed,
        "log_access": log_access,
        "log_warning": log.warning,
        "log_error": log.error,
        "perf_counter": time.perf_counter,
        "timeout_response": simple_response(408),
    }


class NativeHost(_NativeLoop):
    """What both native engines need of the Python loop around them: it gives the engine its plain
    listeners, adopts the connections the engine hands over (:meth:`_adopt`), and drains, stops
    and shuts down with it. ``self.engine`` is set by the subclass."""

    engine: Any

    def __init__(
        self, listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl
    ) -> None:
        super().__init__(listeners, app, config, control)
        self.engine_listeners: dict[int, tuple[socket.socket, EnvironBuilder]] = {}
        for fd, entry in list(self.listeners.items()):
            if fd not in self.tls and isinstance(entry[1], NativeEnvironBuilder):
                self.engine_listeners[fd] = self.listeners.pop(fd)
        # a connection's listener, by its environ builder (one per listener)
        self.engine_listener_of = {id(b): fd for fd, (_, b) in self.engine_listeners.items()}

    def _memory_budget(self, limit: int) -> Any:
        return _native.MemoryBudget(limit)  # shared with the engine's threads (see Intake in conn.rs)

    # what the engines answer a refused PROXY header with (native/src/proxy.rs; self.proxy)
    proxy_responses = (simple_response(400), simple_response(403))

    @property
    def pre_request_hook(self) -> Any:
        """gunicorn's pre_request as the engines call it before the app (call.rs), or None;
        post_request runs where the access-log line is written (self.access_log: a Finisher)."""
        hooks = self.request_hooks
        return hooks.before_wsgi if hooks is not None else None

    def _idle_again(self, conn: Conn) -> bool:
        """A connection the engine handed over (or a response took) that has nothing half-read or
        half-written goes back to the engine: one file or stream response, a chunked upload or a
        health check must not leave a keep-alive connection (an upstream one of a proxy, say) on
        this slower loop for good."""
        listener = self.engine_listener_of.get(id(conn.builder))
        if (
            listener is None
            or self.draining
            or conn.closed
            or conn.busy
            or conn.phase is not Phase.IDLE
            or conn.writing is not None
            or conn.request is not None
            or conn.body is not None
            or conn.out.backlogged
            or conn.parser.in_message
        ):
            return False
        if conn.registered:
            self.poller.unregister(conn.fd)
            conn.registered = False
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
        conn.closed = True  # (this loop is done with it: the engine has the fd)
        self._give_back(conn.sock.detach(), conn.client, listener, conn.since)
        return True

    def _give_back(self, fd: int, client: Any, listener: int, since: float) -> None:
        self.engine.adopt(fd, client, listener, since)

    def _native_listeners(self) -> list[tuple[int, Any]]:
        """(fd, refork._native.Environ) of each listener the engine serves."""
        return [(fd, b.native) for fd, (_, b) in self.engine_listeners.items()]  # type: ignore[attr-defined]

    def _drained(self) -> bool:
        return bool(self.engine.idle)

    def _conn(self, fd: int, client: Any, listener_fd: int) -> Conn:
        """The Python side of an engine connection (not yet polled here)."""
        conn = self.conns.get(fd)
        if conn is not None:  # made by _exchange for this response
            return conn
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        builder = self.engine_listeners[listener_fd][1]
        out = Outbox(sock, client, self.timeouts.write, self.control, buffering=self.pool is None)
        conn = self.conn_type(sock, client, builder, self.limits, out)
        self.conns[fd] = conn
        return conn

    def _adopt(
        self, fd: int, client: Any, listener_fd: int, data: bytes, since: float, fresh: bool, held: int
    ) -> None:
        """A connection the engine hands over with the bytes it has not consumed, and the bytes of
        the worker's budget it charged for them (given back once they are read here)."""
        conn = self._conn(fd, client, listener_fd)
        conn.since = since
        conn.fresh = fresh
        self.poller.register(fd)
        conn.registered = True
        try:
            if data:
                self._on_data(conn, data)
        finally:
            self.memory.give_back(held)

    def _shutdown(self) -> None:
        super()._shutdown()
        self.engine.close_all()

    def _begin_drain(self) -> None:
        super()._begin_drain()
        self.engine.drain(self.drain_until, self.control.server_draining)
        for lsock, _ in self.engine_listeners.values():
            lsock.close()


class _EngineLoop(NativeHost):
    """The native loop (threads == 1) with the engine serving its plain listeners."""

    def __init__(
        self, listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl
    ) -> None:
        super().__init__(listeners, app, config, control)
        self.engine = _native.Engine(self, self._native_listeners(), refs())
        self.returning: list[tuple[int, Any, int, float]] = []  # for the engine, after its run()

    def run(self) -> None:
        # the engine's requests: registered with the clock only if asked (deadlines.ENGINE)
        serving = deadlines.current.set(deadlines.ENGINE if self.engine.accounts else None)
        try:
            super().run()
        finally:
            deadlines.current.reset(serving)

    def _give_back(self, fd: int, client: Any, listener: int, since: float) -> None:
        # (this may run inside engine.run(): a response the engine handed over mid-request)
        self.returning.append((fd, client, listener, since))

    def _drained(self) -> bool:
        return not self.returning and super()._drained()

    def _poll(self, timeout: float) -> list[tuple[int, int]]:
        """The engine serves until this loop's own fds are ready (or the timeout, or a signal)."""
        while self.returning:
            self.engine.adopt(*self.returning.pop())
        handed, ready = self.engine.run(timeout, not (self.draining or self.control.stopping))
        for item in handed:
            self._adopt(*item)
        return self.poller.poll(0) if ready else []

    # ---------------------------------------------------------------- connections from the engine

    def _exchange(
        self, fd: int, client: Any, listener_fd: int, request: Request, keep_alive: bool
    ) -> _Exchange:
        """The app's response leaves the engine's path (write(), or anything but a list body): the
        Python response state for it, over this loop's output for the connection."""
        conn = self._conn(fd, client, listener_fd)
        out = conn.out
        out.token = self._request_token()
        out.request = request
        return _Exchange(ResponseFramer(request, server_keep_alive=keep_alive), out)

    def _request_token(self) -> object:
        """The token of the request in the app (the engine's, registered now if need be)."""
        token = deadlines.current.get()
        if token is deadlines.ENGINE:
            clock = getattr(self.control, "clock", None)
            token = clock.engine_request() if clock is not None and clock.engine_request else None
        return token

    def _finish_slow(
        self, fd: int, client: Any, listener_fd: int, start_response: Any, result: Any,
        exc: Exception | None, environ: dict[str, Any], request: Request, stream: InputStream,
        token: object, started: float | None, keep_alive: bool, rest: bytes,
    ) -> None:  # fmt: skip
        """Send a response the engine did not frame (refork.wsgi.continue_wsgi), then serve the
        connection here: what the client pipelined behind it (`rest`) first."""
        ex = start_response.exchange_now()
        conn = self._conn(fd, client, listener_fd)
        serving = deadlines.current.set(token)
        try:
            outcome = continue_wsgi(ex, environ, request, result, exc=exc)
        finally:
            deadlines.current.reset(serving)
        conn.phase = Phase.IDLE
        conn.since = time.monotonic()
        self.poller.register(fd)
        conn.registered = True
        began = started if started is not None else time.perf_counter()
        if isinstance(outcome, Streaming):
            steps = self._steps(conn, rest)
            self._start_writing(conn, Writing(outcome, request, environ, stream, token, began, steps))
            return
        if not self._finished(request, environ, stream, token, began, outcome, ex) or conn.closed:
            self._close(conn)
        elif rest:
            self._on_data(conn, rest)
        else:
            self._idle_again(conn)

    def _steps(self, conn: Conn, data: bytes) -> Sequence[Step]:
        """Parse pipelined bytes to answer after a response (a bad one: its error, answered then)."""
        if not data:
            return NO_EVENTS
        try:
            return conn.parser.feed(data)
        except ParseError as e:
            return [*e.events, e]

    # ---------------------------------------------------------------- lifetime

    def _sweep(self, now: float) -> None:
        super()._sweep(now)
        self.engine.sweep(now)

    def _safe_point(self) -> None:
        while self.returning:  # the engine's again before the fork (a child forgets them with it)
            self.engine.adopt(*self.returning.pop())
        try:
            super()._safe_point()
        except SystemExit:  # the forked child: the engine's connections are the parent's too
            self.engine.release_after_fork()
            raise


def serve_wsgi_engine(
    listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl
) -> None:
    """Serve WSGI with the engine (one app thread) until the control says stop."""
    _EngineLoop(listeners, app, config, control).run()
