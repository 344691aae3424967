"""The WSGI loop's housekeeping: where connections begin and end, and where the loop itself does.

Mixed into :class:`refork.serving.wsgi.python_loop.PythonLoop` (split out by concern; its state is declared
here, set there): accepting (a TLS listener's connections wrapped for the loop's own handshake),
closing, the once-a-second sweep of the deadlines of :mod:`refork.serving.connection` (handshake,
header, body, write, keep-alive), the drain when the worker stops (the listen backlog taken
first), the safe point (pool threads joined around it; the fork clean-up) and the shutdown.
The hand-over to the app threads of ``--threads`` > 1 and back, and the entry points of an
engine host that owns the loop (:meth:`connection`, :meth:`adopt`, :meth:`finish_handed`,
:meth:`detach`) are here too. The request path (read, parse, call the app, write) is in
:mod:`refork.serving.wsgi.python_loop`.
"""

from __future__ import annotations

import errno
import logging
import queue
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from refork import deadlines
from refork.http.body import InputStream
from refork.http.events import ParseError, Request
from refork.http.parser import Limits
from refork.http.proxy_protocol import ProxyPolicy
from refork.http.response import simple_response
from refork.serving.connection import (
    Expiry,
    Phase,
    Timeouts,
    log_write_timeout,
    release_after_fork,
)
from refork.serving.contract import WorkerControl
from refork.serving.lingering import Lingering
from refork.serving.outbox import Outbox
from refork.serving.poller import Poller
from refork.serving.settings import ServingSettings
from refork.serving.tls_io import TlsConn, TlsOutbox, log_failure, wrap
from refork.serving.wsgi import timed_out
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.conn import NO_EVENTS, Conn, Job, Step, Writing
from refork.serving.wsgi.http2 import Session, sniff
from refork.serving.wsgi.http2_stream import Stream
from refork.wsgi import EnvironBuilder, Outcome, Streaming
from refork.wsgi.response import _Exchange, continue_wsgi

if TYPE_CHECKING:
    from refork.serving.wsgi.roles import SessionLoop

log = logging.getLogger("refork")

class Beside(Protocol):
    """What the Python loop asks of whatever serves beside it: nothing (:class:`Alone`), or the
    native engine whose host owns this loop (refork.serving.wsgi.engine_host, pool_host), which
    serves the plain connections while the loop serves the rest."""

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        """Wait up to `timeout` s for the loop's own ready fds (an engine serves its own meanwhile)."""

    def take_back(self, conn: Conn) -> bool:
        """A connection may be between requests now: True when it is no longer the loop's."""

    def app_idle(self) -> bool:
        """No request of the engine's is in the app (with none of the loop's: a safe point)."""

    def free_threads(self) -> int | None:
        """App threads free for a new request, counted by the engine; None: the loop counts."""

    def drained(self) -> bool:
        """Nothing of the engine's is left (a draining loop may return)."""

    def begin_drain(self, until: float, take_backlog: bool) -> None:
        """The loop began its drain (until then); the engine drains with it."""

    def sweep(self, now: float) -> None:
        """The loop swept its deadlines; the engine sweeps its own."""

    def before_safe_point(self) -> None:
        """No thread of the engine's may run at the safe point (it may fork)."""

    def after_safe_point(self) -> None:
        """The safe point is over in the parent: the engine serves again."""

    def forked(self) -> None:
        """In the forked child: the engine's connections are the parent's."""

    def answer_timed_out(self) -> None:
        """The worker is aborted past --timeout: a 500 to the engine's requests in the app."""

    def shutdown(self) -> None:
        """The loop has shut down: release what the engine owns."""


class Alone:
    """:class:`Beside` for a Python loop that serves every connection itself (--wsgi-loop python)."""

    def __init__(self, poller: Poller) -> None:
        self.poll = poller.poll

    def take_back(self, conn: Conn) -> bool:
        return False

    def app_idle(self) -> bool:
        return True

    def free_threads(self) -> int | None:
        return None

    def drained(self) -> bool:
        return True

    def begin_drain(self, until: float, take_backlog: bool) -> None:
        pass

    def sweep(self, now: float) -> None:
        pass

    def before_safe_point(self) -> None:
        pass

    def after_safe_point(self) -> None:
        pass

    def forked(self) -> None:
        pass

    def answer_timed_out(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class Lifetime:
    """The Python loop's accept, close, sweep, drain, safe point and shutdown, and the entry
    points of an engine host that hands it connections (:meth:`adopt`, :meth:`detach`)."""

    control: WorkerControl
    limits: Limits
    poller: Poller
    conns: dict[int, Conn]
    lingering: Lingering  # the connections closed lingering (refork.serving.lingering)
    listeners: dict[int, tuple[socket.socket, EnvironBuilder]]
    draining: bool
    drain_until: float
    in_flight: int
    timeouts: Timeouts
    accept_paused_until: float
    threads: int
    accepts_held: bool  # no app thread is free: the listeners are out of the poller (_hold_accepts)
    tls: Mapping[int, ssl.SSLContext]
    settings: ServingSettings
    proxy: ProxyPolicy | None
    handshake_timeout: float
    pool: AppThreads | None
    memory: Any  # the worker's MemoryBudget (refork.http.budget, or refork._native's)
    parked: list[Job]
    wake_r: socket.socket | None
    wake_w: socket.socket | None
    done: queue.SimpleQueue[tuple[Conn, bool, Sequence[Step]]]  # what the app threads finished
    conn_type: type[Conn]  # Conn, or the native parser's (refork.serving.wsgi.native_parts.NATIVE)
    beside: Beside
    h1: bool  # --http-protocols (refork.serving.wsgi.http2)
    h2c: bool
    h2_kicked: queue.SimpleQueue[Session]
    h2_parked: list[Stream]  # HTTP/2 streams held for a safe point (see parked)

    if TYPE_CHECKING:  # the request path's, in PythonLoop

        def _settle(self, conn: Conn, writing: Writing, outcome: Outcome) -> bool: ...

        def _app_idle(self) -> bool: ...

        def _on_data(self, conn: Conn, data: bytes) -> None: ...

        def _advance(self, conn: Conn, events: Sequence[Step]) -> bool: ...

        def _respond(self, conn: Conn, request: Request, stream: InputStream, rest: Sequence[Step]
                     ) -> bool | None: ...  # fmt: skip

        def _start_writing(self, conn: Conn, writing: Writing) -> None: ...

        def finished(self, request: Request, environ: dict[str, Any], stream: InputStream, token: object,
                     started: float, outcome: Outcome, ex: _Exchange) -> bool: ...  # fmt: skip

    def answer_timed_out(self) -> None:
        """The worker is aborted past --timeout (refork.deadlines.on_timeout): a 500 to each request
        in an app thread whose response has not started (HTTP/1.1, and HTTP/2 on its stream)."""
        for conn in list(self.conns.values()):
            if conn.h2 is not None:
                conn.h2.answer_timed_out()
            elif conn.busy and not conn.closed and not timed_out.started(conn.out):
                timed_out.answer(conn.out)
        self.beside.answer_timed_out()

    def _shutdown(self) -> None:
        """Release what this loop owns. No epoll unregister: in a forked child it is shared."""
        if self.pool is not None and self._app_idle():
            self.pool.stop()  # idle threads: join them; busy ones (exit_now) are daemons
        for conn in list(self.conns.values()):
            if conn.busy:
                continue  # a pool thread may still write to it (exit_now): process exit closes it
            if conn.writing is not None:
                self._settle(conn, conn.writing, conn.writing.streaming.abandon())
            if conn.body is not None:
                conn.body.discard()
            try:
                conn.sock.close()
            except OSError:
                pass
        self.conns.clear()
        self.lingering.end_all()
        for sock in (self.wake_r, self.wake_w):
            if sock is not None:
                sock.close()
        self.poller.close()
        self.beside.shutdown()

    def _begin_drain(self) -> None:
        """Stop accepting; give open connections a short grace to deliver one more request.

        Closing an idle keep-alive (or just-accepted) connection at once races with a client that
        is sending on it right now: it would see a reset. Instead every request that arrives in
        the grace period is served with "Connection: close", and what is still idle after it is
        closed by the sweep.
        """
        self.draining = True
        self.drain_until = self.timeouts.drain_until(time.monotonic())
        for fd in self.listeners:
            self.poller.unregister(fd)
        if self.control.server_draining:  # take what waits in the backlog, then let go of the listeners
            for entry in self.listeners.values():
                self._accept(entry, batch=1 << 30)
                entry[0].close()
        for session in [c.h2 for c in self.conns.values() if c.h2 is not None]:
            session.stop()  # GOAWAY: the streams it names finish, then the connection closes
        self.beside.begin_drain(self.drain_until, self.control.server_draining)

    def _safe_point(self) -> None:
        """Single-threaded moment for the worker (it may fork); pool threads are joined first."""
        self.beside.before_safe_point()
        if self.pool is not None:
            self.pool.stop()
        try:
            self.control.at_safe_point()
        except SystemExit:  # the forked child unwinding: the client connections are the parent's
            release_after_fork([*self.conns, *self.lingering.fds()])
            self.conns.clear()
            self.lingering.forget()
            self.beside.forked()
            raise
        if self.pool is not None:
            self.pool.start()
            self._dispatch_parked()
        self.beside.after_safe_point()

    def _dispatch_parked(self) -> None:
        """The requests held for a safe point go to the app threads (it was taken, or declined)."""
        parked, self.parked = self.parked, []
        for conn, request, stream, rest in parked:
            self._dispatch(conn, request, stream, rest, force=True)
        streams, self.h2_parked = self.h2_parked, []
        for h2_stream in streams:
            self.h2_dispatch(h2_stream, force=True)

    def _free_threads(self) -> int:
        """App threads free for a new request (a pool's; without one the loop is the app thread)."""
        if self.pool is None:
            return 1 << 30
        counted = self.beside.free_threads()  # the pool engine counts the jobs of both loops
        return max(0, self.threads - self.in_flight) if counted is None else counted

    def _hold_accepts(self) -> None:
        """Accept only while an app thread is free, or no other worker has one: a connection
        accepted with every thread busy would wait behind them (and be lost with them if a hung
        one gets the worker killed) while a sibling could serve it; the kernel offers it to the
        siblings while this one holds. With none free anywhere it has nowhere better to go (and a
        health check on it is answered by this loop)."""
        if self.pool is None or self.draining:
            return
        full = self._free_threads() == 0 and self.control.free_threads_elsewhere
        if full == self.accepts_held:
            return
        self.accepts_held = full
        if self.accept_paused_until:
            return  # out of the poller already; _sweep looks at accepts_held
        for fd in self.listeners:
            if full:
                self.poller.unregister(fd)
            else:
                self.poller.register(fd)

    def _sweep(self, now: float) -> None:
        if self.accept_paused_until and now >= self.accept_paused_until:
            self.accept_paused_until = 0.0
            if not self.draining and not self.accepts_held:
                for fd in self.listeners:
                    self.poller.register(fd)
        expiry = self.timeouts.expiry
        drain_until = self.drain_until if self.draining else 0.0
        write_stalled = self.timeouts.write_stalled
        for conn in [c for c in self.conns.values() if not c.busy]:
            if conn.h2 is not None:
                conn.h2.sweep(now, self.draining, drain_until)
                continue
            if conn.tls is not None and conn.tls.handshaking:
                if now - conn.since > self.handshake_timeout:
                    log_failure(conn.client, TimeoutError("handshake timeout"), True)
                    self._close(conn)
                elif self.draining and now >= drain_until:
                    self._close(conn)
                continue
            writing = conn.writing
            if writing is not None:
                if write_stalled(conn.since, now):
                    log_write_timeout(self.timeouts.write, conn.client, writing.request)
                    self._close(conn)
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
            self._close(conn, answered=True)  # (a request sent right now meets a FIN, not a reset)
        self.lingering.sweep(now)
        self.beside.sweep(now)

    def _accept(self, entry: tuple[socket.socket, EnvironBuilder], batch: int = 0) -> None:
        """Accept up to `batch` connections (0: the settings' accept batch)."""
        lsock, builder = entry
        batch = batch or self.settings.accept_batch
        inet = lsock.family in (socket.AF_INET, socket.AF_INET6)
        now = time.monotonic()
        if self.pool is not None and not self.draining:
            batch = min(batch, max(1, self._free_threads()))  # no more than it can start
        for _ in range(batch):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                # out of fds or memory (or worse): back off instead of spinning on a ready listener
                log.error("accept() failed: %s; pausing accepts for a second", e)
                for fd in self.listeners:
                    self.poller.unregister(fd)
                self.accept_paused_until = now + 1.0
                return
            sock.setblocking(False)
            if inet:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            client = (addr[0], addr[1]) if inet else None
            ctx = self.tls.get(lsock.fileno()) if self.tls else None
            if ctx is not None:
                conn = self._tls_conn(ctx, sock, client, builder)
                if conn is None:
                    continue
            else:
                out = Outbox(sock, client, self.timeouts.write, self.control, buffering=self.pool is None)
                conn = self.conn_type(sock, client, builder, self.limits, out)
            conn.since = now
            if self.proxy is not None:
                conn.preface = b""  # a PROXY header may come first (see threaded._read_preface)
            if self.h2c and ctx is None:
                conn.sniffed = b""  # the HTTP/2 preface may come first (refork.serving.wsgi.http2.sniff)
            self.conns[conn.fd] = conn
            self.poller.register(conn.fd)
            conn.registered = True

    def _close(self, conn: Conn, answered: bool = False) -> None:
        """`answered`: the connection is done with (its last response written, a refusal, an idle
        one): it closes lingering (refork.serving.lingering), what its client still sends dropped."""
        if conn.closed:
            return
        conn.closed = True
        if conn.h2 is not None:
            conn.h2.lost()
        writing = conn.writing
        if writing is not None:
            self._settle(conn, writing, writing.streaming.abandon())
        if conn.registered:
            self.poller.unregister(conn.fd)
            conn.registered = False
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
        if conn.body is not None:
            conn.body.discard()
            conn.body = None
        conn.parser.release()
        if conn.held:
            self.memory.give_back(conn.held)
            conn.held = 0
        if conn.tls is not None:
            conn.tls.close_notify()
        if answered:
            self.lingering.close(conn.sock, time.monotonic())
            return
        try:
            conn.sock.close()
        except OSError:
            pass

    # ---------------------------------------------------------------- an engine host's entry points

    def connection(self, fd: int, client: Any, builder: EnvironBuilder) -> Conn:
        """The loop's side of a connection an engine hands over (made once, not yet polled)."""
        conn = self.conns.get(fd)
        if conn is not None:  # made already for this response (an engine's response_exchange)
            return conn
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        out = Outbox(sock, client, self.timeouts.write, self.control, buffering=self.pool is None)
        conn = self.conn_type(sock, client, builder, self.limits, out)
        self.conns[fd] = conn
        return conn

    def adopt(self, fd: int, client: Any, builder: EnvironBuilder, data: bytes, since: float, fresh: bool,
              held: int) -> None:  # fmt: skip
        """A connection an engine hands over with the bytes it has not consumed, and the bytes of
        the worker's budget it charged for them (given back once they are read here)."""
        conn = self.connection(fd, client, builder)
        conn.since = since
        conn.fresh = fresh
        self.poller.register(fd)
        conn.registered = True
        try:
            if data and self.h2c and (data[:1] == b"P" or not self.h1):  # what opens with the preface
                conn.sniffed = b""
                data = sniff(cast("SessionLoop[Session, Stream]", self), conn, data)
            if data:
                self._on_data(conn, data)
        finally:
            self.memory.give_back(held)

    def h2_kick(self, session: Session) -> None:
        """From an app thread: an HTTP/2 connection has bytes to send, or a call ended."""
        self.h2_kicked.put(session)
        try:
            assert self.wake_w is not None
            self.wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up byte is already pending

    def detach(self, conn: Conn) -> int:
        """The loop lets go of a connection without closing it (an engine takes it back): its fd."""
        if conn.registered:
            self.poller.unregister(conn.fd)
            conn.registered = False
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
        conn.closed = True  # (this loop is done with it: the engine has the fd)
        return conn.sock.detach()

    def finish_handed(self, conn: Conn, ex: _Exchange, environ: dict[str, Any], request: Request, result: Any,
                      exc: Exception | None, stream: InputStream, token: object, started: float | None,
                      rest: bytes) -> None:  # fmt: skip
        """Send a response an engine did not frame (refork.wsgi.continue_wsgi), then serve the
        connection here: what the client pipelined behind it (`rest`) first."""
        serving = deadlines.current.set(token)
        try:
            outcome = continue_wsgi(ex, environ, request, result, exc=exc)
        finally:
            deadlines.current.reset(serving)
        conn.phase = Phase.IDLE
        conn.since = time.monotonic()
        self.poller.register(conn.fd)
        conn.registered = True
        began = started if started is not None else time.perf_counter()
        if isinstance(outcome, Streaming):
            steps = self._steps(conn, rest)
            self._start_writing(conn, Writing(outcome, request, environ, stream, token, began, steps))
            return
        if not self.finished(request, environ, stream, token, began, outcome, ex) or conn.closed:
            self._close(conn)
        elif rest:
            self._on_data(conn, rest)
        else:
            self.beside.take_back(conn)

    def _steps(self, conn: Conn, data: bytes) -> Sequence[Step]:
        """Parse pipelined bytes to answer after a response (a bad one: its error, answered then)."""
        if not data:
            return NO_EVENTS
        try:
            return conn.parser.feed(data)
        except ParseError as e:
            return [*e.events, e]

    def _tls_conn(self, ctx: ssl.SSLContext, sock: socket.socket, client: Any, builder: EnvironBuilder
                  ) -> Conn | None:  # fmt: skip
        """A connection on a TLS listener: wrapped, its handshake left to _on_readable."""
        try:
            tsock = wrap(ctx, sock)
        except OSError as e:  # the client is already gone
            log_failure(client, e, True)
            sock.close()
            return None
        out = TlsOutbox(tsock, client, self.timeouts.write, self.control, buffering=self.pool is None)
        return self.conn_type(tsock, client, builder, self.limits, out, TlsConn(tsock))

    # ---------------------------------------------------------------- the pool (threads > 1)

    def _dispatch(
        self, conn: Conn, request: Request, stream: InputStream, rest: Sequence[Step], force: bool = False
    ) -> None:
        if conn.registered:
            self.poller.unregister(conn.fd)
            conn.registered = False
        if not force and self.control.safe_point_wanted:
            self.parked.append((conn, request, stream, rest))  # hold it until the safe point
            conn.busy = True
            return
        conn.busy = True
        self.in_flight += 1
        assert self.pool is not None
        self.pool.submit((conn, request, stream, rest))

    def h2_dispatch(self, stream: Stream, force: bool = False) -> None:
        """An HTTP/2 stream's app call for the app threads; held while a safe point is wanted, as
        a request is (refork.serving.wsgi.http2)."""
        if not force and self.control.safe_point_wanted:
            self.h2_parked.append(stream)
            return
        self.in_flight += 1
        assert self.pool is not None
        self.pool.submit((stream, None, None, None))  # (_pool_job: stream.run())

    def _pool_job(self, conn: Conn | Stream, request: Request | None, stream: InputStream,
                  rest: Sequence[Step]) -> None:  # fmt: skip
        if request is None:  # an HTTP/2 stream's app call (refork.serving.wsgi.http2): it accounts itself
            assert isinstance(conn, Stream)
            conn.run()
            return
        assert isinstance(conn, Conn)
        keep: bool | None = False
        try:
            keep = self._respond(conn, request, stream, rest)  # a blocking Outbox: never None
        except Exception:
            log.exception("Error serving a request")
        finally:
            self.done.put((conn, bool(keep), rest))
            try:
                assert self.wake_w is not None
                self.wake_w.send(b"\0")
            except (BlockingIOError, OSError):
                pass  # a wake-up byte is already pending

    def _on_wake(self) -> None:
        assert self.wake_r is not None
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        while True:  # HTTP/2 connections whose app threads have bytes to send or calls ended
            try:
                session = self.h2_kicked.get_nowait()
            except queue.Empty:
                break
            session.service()
        while True:
            try:
                conn, keep, rest = self.done.get_nowait()
            except queue.Empty:
                return
            self.in_flight -= 1
            conn.busy = False
            if not keep or conn.closed:
                self._close(conn, answered=True)
                continue
            try:
                if self._advance(conn, rest):  # pipelined requests first; sets the deadline
                    continue
            except Exception:
                log.exception("Error serving a connection")
                self._close(conn)
                continue
            if self.beside.take_back(conn):
                continue
            self.poller.register(conn.fd)
            conn.registered = True
