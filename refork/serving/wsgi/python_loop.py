"""The WSGI Python loop: one epoll I/O thread, optionally a small pool of app threads.

:class:`PythonLoop` runs the loop and each part of a connection's life that is the loop's, not a
request's: its parts are the listeners (:mod:`refork.serving.wsgi.accepting`), the connections
and their request path (:mod:`refork.serving.wsgi.request_path`), and what serves beside it
(:mod:`refork.serving.wsgi.beside`: nothing, or the native engine of the host that owns the loop).
Here: the once-a-second sweep of the deadlines of :mod:`refork.serving.connection` (handshake,
header, body, write, keep-alive; a response write that makes no progress for the write timeout
is cut and logged), the drain when the worker stops (the listen backlog taken first), the safe
point (app threads joined around it; the fork clean-up), the shutdown, and the entry points of
an engine host that hands it connections (:meth:`PythonLoop.adopt`,
:meth:`PythonLoop.finish_handed`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from refork import deadlines
from refork.config import Config
from refork.http.body import InputStream
from refork.http.events import ParseError, Request
from refork.http.response import simple_response
from refork.memory.allocator import FloodTrim
from refork.serving.connection import TICK, Expiry, Phase, log_write_timeout
from refork.serving.contract import WorkerControl
from refork.serving.http2 import alpn_protocols
from refork.serving.poller import Poller
from refork.serving.settings import ServingSettings
from refork.serving.tls_io import log_failure
from refork.serving.wsgi import timed_out
from refork.serving.wsgi.accepting import Acceptor, Listeners, listening
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.beside import Alone, Beside
from refork.serving.wsgi.conn import NO_EVENTS, PYTHON, Conn, LoopParts, Step, Writing
from refork.serving.wsgi.http2 import sniff
from refork.serving.wsgi.request_path import RequestPath
from refork.wsgi import EnvironBuilder, Outcome, Streaming
from refork.wsgi.response import _Exchange, continue_wsgi


class PythonLoop:
    """The loop. Alone it serves every connection (--wsgi-loop python); an engine host owns one
    for the connections its engine hands over, and gives it what serves `beside` it."""

    def __init__(
        self, listeners: Listeners, app: Any, config: Config, control: WorkerControl,
        settings: ServingSettings, parts: LoopParts = PYTHON, beside: Beside | None = None,
        app_threads: Callable[[int, Callable[..., None]], AppThreads] = AppThreads,
        poller: Poller | None = None, memory: Any = None,
    ) -> None:  # fmt: skip
        """`poller` and `memory` (the worker's budget of request bytes held): an engine host's,
        shared with its engine; made here otherwise."""
        self.control = control
        self.settings = settings
        self.timeouts = settings.timeouts
        self.poller = poller = poller if poller is not None else Poller()
        self.beside = beside = beside if beside is not None else Alone(poller)
        if memory is None:
            memory = parts.memory(settings.max_request_memory)
        self.path = RequestPath(app, config, control, settings, parts, poller, memory, beside, app_threads)
        alpn = alpn_protocols(config)
        self.acceptor = Acceptor(listeners, poller, control, settings, parts.conn_type, alpn)
        self.draining = False  # the listeners let go of (the request path drains with it: path.drain)
        self.drain_until = 0.0

    # ---------------------------------------------------------------- the loop

    def run(self) -> None:
        control, poller, path, acceptor = self.control, self.poller, self.path, self.acceptor
        conns, lingering = path.conns, path.lingering
        listeners = acceptor.listeners
        on_readable, on_writable = path.on_readable, path.on_writable
        poll, handed = self.beside.poll, self.beside.handed
        control_fd = control.fileno()
        handoff = path.handoff
        wake_fd = handoff.wake_r.fileno() if handoff is not None else -1
        poller.register(control_fd)
        acceptor.register()
        if handoff is not None:
            poller.register(wake_fd)
            handoff.pool.start()
            deadlines.on_timeout(self.answer_timed_out)  # (one thread: refork.deadlines.TimedOut)
        next_tick = 0.0
        flood_trim = FloodTrim()
        try:
            while True:
                if control.exit_now:
                    return
                if control.stopping and not self.draining:
                    self._begin_drain()
                drained = not (conns or lingering) and path.in_flight == 0  # (lingering: LINGER at most)
                if self.draining and drained and self.beside.drained():
                    return
                if control.safe_point_wanted:
                    if self._app_idle():
                        self._safe_point()
                elif handoff is not None and (handoff.parked or handoff.parked_streams):
                    path.dispatch_parked()  # the worker declined the promotion it held them for
                self._hold_accepts()
                ready = poll(max(0.0, min(1.0, next_tick - time.monotonic())))
                if handed:  # the engine's connections first
                    self._adopt_handed()
                for fd, _ in ready:
                    conn = conns.get(fd)
                    if conn is not None:
                        if conn.writing is None:
                            on_readable(conn)
                        else:
                            on_writable(conn)
                    elif fd in lingering:
                        lingering.on_readable(fd)
                    elif fd in listeners:
                        self._accept(listeners[fd])
                    elif fd == control_fd:
                        control.on_readable()
                    elif fd == wake_fd:
                        path.on_wake()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + (TICK / 4 if self.draining else TICK)
                    control.tick()
                    self._sweep(now)
                    # a flood of buffered requests is over: give its freed heap back
                    flood_trim.tick(path.memory.ebbed(), (len(conns), path.memory.used))
        finally:
            self._shutdown()

    def _adopt_handed(self) -> None:
        """Adopt what the engine handed over in the last poll (Beside.handed). A call of its own:
        its locals, and the bytes they hold, are gone once it returns."""
        handed = self.beside.handed
        adopted = handed[:]
        handed.clear()
        for item in adopted:
            self.adopt(*item)

    def _app_idle(self) -> bool:
        """No request is in the app or waiting for an app thread (a safe point may fork)."""
        return self.path.in_flight == 0 and self.beside.app_idle()

    def _free_threads(self) -> int:
        """App threads free for a new request (a pool's; without one the loop is the app thread)."""
        if self.path.pool is None:
            return 1 << 30
        counted = self.beside.free_threads()  # the pool engine counts the jobs of both loops
        return max(0, self.path.threads - self.path.in_flight) if counted is None else counted

    def _hold_accepts(self) -> None:
        """Accept only while an app thread is free, or no other worker has one: a connection
        accepted with every thread busy would wait behind them (and be lost with them if a hung
        one gets the worker killed) while a sibling could serve it; the kernel offers it to the
        siblings while this one holds. With none free anywhere it has nowhere better to go (and a
        health check on it is answered by this loop)."""
        if self.path.pool is None or self.draining:
            return
        full = self._free_threads() == 0 and self.control.free_threads_elsewhere
        if full != self.acceptor.held:
            self.acceptor.hold(full)

    def _accept(self, entry: tuple[socket.socket, EnvironBuilder], batch: int = 0) -> None:
        """Accept up to `batch` connections (0: the settings' accept batch)."""
        batch = batch or self.settings.accept_batch
        if self.path.pool is not None and not self.draining:
            batch = min(batch, max(1, self._free_threads()))  # no more than it can start
        for conn in self.acceptor.accept(entry, batch):
            self.path.add(conn)

    # ---------------------------------------------------------------- deadlines, drain, safe point

    def _sweep(self, now: float) -> None:
        self.acceptor.resume(now, self.draining)
        path = self.path
        expiry = self.timeouts.expiry
        drain_until = self.drain_until if self.draining else 0.0
        write_stalled = self.timeouts.write_stalled
        handshake_timeout = self.settings.handshake_timeout
        for conn in [c for c in path.conns.values() if not c.busy]:
            if conn.h2 is not None:
                conn.h2.sweep(now, self.draining, drain_until)
                continue
            if conn.tls is not None and conn.tls.handshaking:
                if now - conn.since > handshake_timeout:
                    log_failure(conn.client, TimeoutError("handshake timeout"), True)
                    path.close(conn)
                elif self.draining and now >= drain_until:
                    path.close(conn)
                continue
            writing = conn.writing
            if writing is not None:
                if write_stalled(conn.since, now):
                    log_write_timeout(self.timeouts.write, conn.client, writing.request)
                    path.close(conn)
                continue
            verdict = expiry(conn.phase, conn.since, now, drain_until, conn.received, conn.fresh)
            if verdict is Expiry.NONE:
                continue
            if verdict is Expiry.REQUEST_TIMEOUT:
                try:
                    conn.sock.send(simple_response(408))
                except OSError:
                    pass
            elif conn.has_input():
                continue  # a request arrived while the loop was busy (threads == 1): serve it
            path.close(conn, answered=True)  # (a request sent right now meets a FIN, not a reset)
        path.lingering.sweep(now)
        self.beside.sweep(now)

    def _begin_drain(self) -> None:
        """Stop accepting; give open connections a short grace to deliver one more request.

        Closing an idle keep-alive (or just-accepted) connection at once races with a client that
        is sending on it right now: it would see a reset. Instead every request that arrives in
        the grace period is served with "Connection: close", and what is still idle after it is
        closed by the sweep.
        """
        self.draining = True
        self.drain_until = self.timeouts.drain_until(time.monotonic())
        self.acceptor.unregister()
        if self.control.server_draining:  # take what waits in the backlog, then let go of the listeners
            for entry in self.acceptor.listeners.values():
                self._accept(entry, batch=1 << 30)
                entry[0].close()
        self.path.drain()
        self.beside.begin_drain(self.drain_until, self.control.server_draining)

    def _safe_point(self) -> None:
        """Single-threaded moment for the worker (it may fork); app threads are joined first."""
        self.beside.before_safe_point()
        pool = self.path.pool
        if pool is not None:
            pool.stop()
        try:
            self.control.at_safe_point()
        except SystemExit:  # the forked child unwinding: the client connections are the parent's
            self.path.forked()
            self.beside.forked()
            raise
        if pool is not None:
            pool.start()
            self.path.dispatch_parked()
        self.beside.after_safe_point()

    def answer_timed_out(self) -> None:
        """The worker is aborted past --timeout (refork.deadlines.on_timeout): a 500 to each request
        in an app thread whose response has not started (HTTP/1.1, and HTTP/2 on its stream)."""
        for conn in list(self.path.conns.values()):
            if conn.h2 is not None:
                conn.h2.answer_timed_out()
            elif conn.busy and not conn.closed and not timed_out.started(conn.out):
                timed_out.answer(conn.out)
        self.beside.answer_timed_out()

    def _shutdown(self) -> None:
        """Release what this loop owns. No epoll unregister: in a forked child it is shared."""
        pool = self.path.pool
        if pool is not None and self._app_idle():
            pool.stop()  # idle threads: join them; busy ones (exit_now) are daemons
        self.path.shutdown()
        self.poller.close()
        self.beside.shutdown()

    # ---------------------------------------------------------------- an engine host's entry points

    def connection(self, fd: int, client: Any, builder: EnvironBuilder) -> Conn:
        """The loop's side of a connection an engine hands over (made once, not yet polled)."""
        conn = self.path.conns.get(fd)
        if conn is not None:  # made already for this response (an engine's response_exchange)
            return conn
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        conn = self.acceptor.plain(sock, client, builder)
        self.path.add(conn, polled=False)
        return conn

    def adopt(self, fd: int, client: Any, builder: EnvironBuilder, data: bytes, since: float, fresh: bool,
              held: int) -> None:  # fmt: skip
        """A connection an engine hands over with the bytes it has not consumed, and the bytes of
        the worker's budget it charged for them (given back once they are read here)."""
        path = self.path
        conn = self.connection(fd, client, builder)
        conn.since = since
        conn.fresh = fresh
        path.watch(conn)
        try:
            if data and path.h2c and (data[:1] == b"P" or not path.h1):  # what opens with the preface
                conn.sniffed = b""
                data = sniff(path, conn, data)
            if data:
                path.on_data(conn, data)
        finally:
            path.memory.give_back(held)

    def finished(self, request: Request, environ: dict[str, Any], stream: InputStream, token: object,
                 started: float, outcome: Outcome, ex: _Exchange) -> bool:  # fmt: skip
        """A response of an engine's request is done (RequestPath.finished); True to keep it."""
        return self.path.finished(request, environ, stream, token, started, outcome, ex)

    def finish_handed(self, conn: Conn, ex: _Exchange, environ: dict[str, Any], request: Request, result: Any,
                      exc: Exception | None, stream: InputStream, token: object, started: float | None,
                      rest: bytes) -> None:  # fmt: skip
        """Send a response an engine did not frame (refork.wsgi.continue_wsgi), then serve the
        connection here: what the client pipelined behind it (`rest`) first."""
        path = self.path
        serving = deadlines.current.set(token)
        try:
            outcome = continue_wsgi(ex, environ, request, result, exc=exc)
        finally:
            deadlines.current.reset(serving)
        conn.phase = Phase.IDLE
        conn.since = time.monotonic()
        path.watch(conn)
        began = started if started is not None else time.perf_counter()
        if isinstance(outcome, Streaming):
            steps = self._steps(conn, rest)
            path.start_writing(conn, Writing(outcome, request, environ, stream, token, began, steps))
            return
        if not path.finished(request, environ, stream, token, began, outcome, ex) or conn.closed:
            path.close(conn)
        elif rest:
            path.on_data(conn, rest)
        else:
            path.take_back(conn)

    @staticmethod
    def _steps(conn: Conn, data: bytes) -> Sequence[Step]:
        """Parse pipelined bytes to answer after a response (a bad one: its error, answered then)."""
        if not data:
            return NO_EVENTS
        try:
            return conn.parser.feed(data)
        except ParseError as e:
            return [*e.events, e]


def serve_wsgi(listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
               settings: ServingSettings) -> None:  # fmt: skip
    """Serve WSGI on these listeners until the control says stop (see WorkerControl)."""
    PythonLoop(listening(listeners, settings, PYTHON.builder), app, config, control, settings).run()
