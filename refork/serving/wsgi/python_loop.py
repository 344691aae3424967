"""The WSGI connection loop: one epoll I/O thread, optionally a small pool of app threads.

Idle keep-alive and slow clients cost a dict entry, never a thread: only complete requests (head
and whole body) reach the app. With ``threads == 1`` the app runs on the loop thread (the lean
path: one recv and one send per request); a response the client does not read as fast as it is
produced becomes a writer state of its connection (:mod:`refork.serving.outbox`): the loop
serves other connections and pulls the next body item only when the socket took the last one.
With more threads, a connection is unregistered while a pool thread serves it (and may block
on its writes, bounded by the write timeout) and handed back through a queue and a wake-up
socketpair.

The deadlines and the drain are those of :mod:`refork.serving.connection`; a response write
that makes no progress for the write timeout is cut and logged. This module is the request path
(read, parse, call the app, write, the pool's hand-over); accepting, closing, the deadline sweep,
the drain, the safe point and the shutdown are :mod:`refork.serving.wsgi.python_loop_lifetime`.
"""

from __future__ import annotations

import logging
import queue
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from refork import deadlines
from refork.config import Config
from refork.http.body import EMPTY_INPUT, BodyBuffer, InputStream, Spool
from refork.http.events import Body, EndOfMessage, ParseError, Request
from refork.http.proxy_protocol import INCOMPLETE, ProxyError, ProxyHeader
from refork.http.response import CONTINUE, simple_response
from refork.memory.allocator import malloc_trim
from refork.serving.connection import TICK, Phase, RequestEnd, log_access
from refork.serving.contract import WorkerControl
from refork.serving.health import health_response
from refork.serving.http2 import alpn_protocols, http2_limits
from refork.serving.lingering import Lingering
from refork.serving.poller import IN as _IN
from refork.serving.poller import Poller
from refork.serving.proxied import CLOSED, peer_host, read_preface, refuse
from refork.serving.settings import ServingSettings
from refork.serving.tls_io import TlsConn, log_failure
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.conn import NO_EVENTS, PYTHON, Conn, Job, LoopParts, Step, Writing
from refork.serving.wsgi.http2 import Session, sniff, take_over
from refork.serving.wsgi.http2_stream import Stream
from refork.serving.wsgi.python_loop_lifetime import Alone, Beside, Lifetime
from refork.wsgi import EnvironBuilder, Outcome, Streaming
from refork.wsgi.response import _Exchange

log = logging.getLogger("refork")

_IDLE, _HEAD, _BODY, _WRITING = Phase.IDLE, Phase.HEAD, Phase.BODY, Phase.WRITING
# A WebSocket handshake to a WSGI app (WSGI has no WebSocket interface): 400, not the app's to see.
# 4xx: the request asks what this endpoint cannot do, nothing failed on the server (no 5xx alert);
# not 403, which an ASGI app's refusal answers (the two stay distinguishable); not 426, which asks
# the client to upgrade. gunicorn hands the request to the app, which then answers it as plain HTTP.
_WEBSOCKET_REFUSED = (
    b"WebSocket upgrade refused: this server runs a WSGI app, which cannot accept WebSockets\n"
)


class PythonLoop(Lifetime):
    """The loop: its state, the run, and the request path (accept, sweep, drain: :class:`Lifetime`).

    Alone it serves every connection (--wsgi-loop python); an engine host owns one for the
    connections its engine hands over, and is what serves `beside` it.
    """

    # Out of the instance __dict__: CPython 3.11 and 3.12 stop specializing attribute reads on an
    # instance whose __dict__ holds 30 keys or more, and every self.x of the loop's per-request
    # code then costs twice as much.
    __slots__ = ("proxy", "request_hooks", "start_wsgi", "conn_type", "beside", "settings", "read_size",
                 "h1", "h2c", "h2_alpn", "h2_limits", "h2_kicked", "h2_parked")

    def __init__(
        self, listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
        settings: ServingSettings, parts: LoopParts = PYTHON, beside: Beside | None = None,
        app_threads: Callable[[int, Callable[..., None]], AppThreads] = AppThreads,
    ) -> None:  # fmt: skip
        self.app = app
        self.control = control
        self.settings = settings
        self.conn_type = parts.conn_type
        self.start_wsgi = parts.start_wsgi
        self.read_size = settings.read_size
        self.limits = settings.limits
        self.poller = Poller()
        # one buffer every read lands in, copied out at its size: a 64 KiB bytes shrunk to what
        # arrived (recv) leaves the heap fragmented under many connections sending bodies at once
        self._scratch = bytearray(settings.read_size)
        self._scratch_view = memoryview(self._scratch)
        self.conns: dict[int, Conn] = {}
        self.lingering = Lingering(self.poller)
        self.listeners: dict[int, tuple[socket.socket, EnvironBuilder]] = {}
        self.threads = settings.threads
        self.draining = False
        self.drain_until = 0.0
        self.in_flight = 0
        self.spool = settings.inline_body
        self.spool_budget = Spool(config.max_spool, config.spool_dir)  # bytes in spool files, all conns
        self.memory = parts.memory(settings.max_request_memory)  # request bytes held, all conns
        self.timeouts = settings.timeouts
        self.accept_paused_until = 0.0
        self.accepts_held = False
        self.request_hooks = settings.request_hooks  # pre_request / post_request, if any
        self.access_log: RequestEnd | None = settings.request_end
        self.health = settings.health
        self.tls = settings.tls  # listener fd -> SSLContext (TLS listeners)
        self.proxy = settings.proxy
        self.handshake_timeout = settings.handshake_timeout
        self.h1, self.h2c = settings.h1, settings.h2c  # HTTP/2 (refork.serving.wsgi.http2): h2c, h2 by ALPN
        self.h2_alpn = "h2" in config.http_protocols and bool(self.tls)
        self.h2_limits = http2_limits(config)
        self.h2_kicked: queue.SimpleQueue[Session] = queue.SimpleQueue()  # app threads' news for the loop
        self.h2_parked: list[Stream] = []
        for context in set(self.tls.values()):  # (this process's copy of the context)
            context.set_alpn_protocols(alpn_protocols(config))
        for lsock in listeners:
            lsock.setblocking(False)
            try:
                addr = lsock.getsockname()
            except OSError:
                addr = ""
            server = (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) else str(addr)
            builder = EnvironBuilder(
                server=server,
                root_path=settings.root_path,
                multithread=self.threads > 1,
                proxies=settings.forwarded,
                url_scheme="https" if lsock.fileno() in self.tls else "http",
            )
            self.listeners[lsock.fileno()] = (lsock, parts.builder(builder))
        self.pool: AppThreads | None = None
        self.done: queue.SimpleQueue[tuple[Conn, bool, Sequence[Step]]] = queue.SimpleQueue()
        self.parked: list[Job] = []
        self.wake_r: socket.socket | None = None
        self.wake_w: socket.socket | None = None
        if self.threads > 1:
            self.pool = app_threads(self.threads, self._pool_job)
            self.wake_r, self.wake_w = socket.socketpair()
            self.wake_r.setblocking(False)
            self.wake_w.setblocking(False)
        self.beside = beside if beside is not None else Alone(self.poller)

    # ---------------------------------------------------------------- the loop

    def run(self) -> None:
        control = self.control
        poller = self.poller
        conns, lingering = self.conns, self.lingering
        listeners = self.listeners
        control_fd = control.fileno()
        wake_fd = self.wake_r.fileno() if self.wake_r is not None else -1
        poller.register(control_fd)
        for fd in listeners:
            poller.register(fd)
        if self.wake_r is not None:
            poller.register(wake_fd)
        if self.pool is not None:
            self.pool.start()
            deadlines.on_timeout(self.answer_timed_out)  # (one thread: refork.deadlines.TimedOut)
        next_tick = 0.0
        try:
            while True:
                if control.exit_now:
                    return
                if control.stopping and not self.draining:
                    self._begin_drain()
                drained = not (conns or lingering) and self.in_flight == 0  # (lingering: LINGER at most)
                if self.draining and drained and self.beside.drained():
                    return
                if control.safe_point_wanted:
                    if self._app_idle():
                        self._safe_point()
                elif self.parked or self.h2_parked:  # the worker declined the promotion it held them for
                    self._dispatch_parked()
                self._hold_accepts()
                for fd, _ in self.beside.poll(max(0.0, min(1.0, next_tick - time.monotonic()))):
                    conn = conns.get(fd)
                    if conn is not None:
                        if conn.writing is None:
                            self._on_readable(conn)
                        else:
                            self._on_writable(conn)
                    elif fd in lingering:
                        lingering.on_readable(fd)
                    elif fd in listeners:
                        self._accept(listeners[fd])
                    elif fd == control_fd:
                        control.on_readable()
                    elif fd == wake_fd:
                        self._on_wake()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + (TICK / 4 if self.draining else TICK)
                    control.tick()
                    self._sweep(now)
                    if self.memory.ebbed():  # a flood of buffered requests is over:
                        malloc_trim()  # give its freed heap back
        finally:
            self._shutdown()

    def _app_idle(self) -> bool:
        """No request is in the app or waiting for an app thread (a safe point may fork)."""
        return self.in_flight == 0 and self.beside.app_idle()

    # ---------------------------------------------------------------- reading and answering

    def _tls_read(self, conn: Conn, tconn: TlsConn) -> bytes | None:
        """Handshake, then read, from this loop only; None: nothing yet, or the connection failed."""
        handshaking = tconn.handshaking
        try:
            data = tconn.read(self.read_size)
        except OSError as e:  # garbage, plain HTTP, a refused client certificate: debug, no trace
            log_failure(conn.client, e, tconn.handshaking)
            self._close(conn)
            return None
        if tconn.wants != tconn.polled:
            tconn.polled = tconn.wants
            self.poller.watch(conn.fd, tconn.wants)
        if handshaking and not tconn.handshaking:
            conn.since = time.monotonic()  # handshake done: the keep-alive clock until a head starts
            if self.h2_alpn and tconn.sock.selected_alpn_protocol() == "h2":
                take_over(self, conn, data or b"")  # HTTP/2 from here (refork.serving.wsgi.http2)
                return None
        return data

    def _on_readable(self, conn: Conn) -> None:
        if conn.h2 is not None:
            conn.h2.on_ready()
            return
        if conn.preface is not None and not self._read_preface(conn):
            return
        tconn = conn.tls
        if tconn is not None:
            data = self._tls_read(conn, tconn)
            if data is None:
                return
        else:
            try:
                n = conn.sock.recv_into(self._scratch)
                data = self._scratch_view[:n].tobytes()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._close(conn)
                return
        if not data:
            self._close(conn)
            return
        if conn.sniffed is not None:
            data = sniff(self, conn, data)
            if not data:
                return
        conn.fresh = False
        self._on_data(conn, data)

    def _read_preface(self, conn: Conn) -> bool:
        """The PROXY header at the start of a connection (refork.serving.proxied): True once it is
        read (or there is none) and the connection's own bytes may be read; its client is then the
        connection's. False: wait for more, or the connection is closed."""
        assert self.proxy is not None and conn.preface is not None
        peer = peer_host(conn.client)
        try:
            verdict, conn.preface = read_preface(conn.sock, conn.preface, self.proxy, peer)
        except (BlockingIOError, InterruptedError):
            return False
        except ProxyError as e:
            refuse(conn.sock, peer, e, conn.tls is not None)
            self._close(conn, answered=True)
            return False
        if verdict is INCOMPLETE:
            conn.fresh = False
            if conn.phase is not _HEAD:  # the header timeout bounds it, as a request head's
                conn.phase = _HEAD
                conn.since = time.monotonic()
            return False
        if verdict is CLOSED:
            self._close(conn)
            return False
        conn.preface = None
        if isinstance(verdict, ProxyHeader):
            conn.fresh = False
            conn.phase = _IDLE
            conn.since = time.monotonic()
            if verdict.client is not None:
                conn.client = conn.out.client = verdict.client
        return True

    def _on_data(self, conn: Conn, data: bytes) -> None:
        """Parse what the client sent and answer every request it completes."""
        parser = conn.parser
        try:
            events: Sequence[Step] = parser.feed(data)
        except ParseError as e:
            self.memory.note(len(data))  # (its bytes went through, if only to be refused)
            if not e.events:
                self._reject(conn, e.status)
                return
            events = [*e.events, e]  # the requests before the bad bytes are answered first
        else:
            if conn.held or parser.in_message:
                refused = self._hold(conn)
                if refused is not None:
                    if not events:
                        self._reject(conn, refused.status)
                        return
                    events = [*events, refused]
        try:
            if (
                len(events) == 2
                and self.pool is None
                and conn.request is None
                and type(events[1]) is EndOfMessage
                and type(events[0]) is Request
            ):  # the common case, one bodiless request per read: skip the general event walk
                keep = self._respond(conn, events[0], EMPTY_INPUT, NO_EVENTS)
                if keep:
                    conn.phase = _IDLE
                    conn.since = time.monotonic()
                    self.beside.take_back(conn)
                elif keep is not None:  # None: the response waits for the client to read
                    self._close(conn, answered=True)
            elif not self._advance(conn, events):
                self.beside.take_back(conn)
        except Exception:
            log.exception("Error serving a connection")
            self._close(conn)

    def _hold(self, conn: Conn) -> ParseError | None:
        """Charge what the connection's parser holds now to the worker's --max-request-memory; a
        head that does not fit is refused (503: the server is short of room now, not the request
        too big), other bytes (kept for a replay) are charged all the same."""
        parser = conn.parser
        held = parser.buffered if parser.in_message else 0
        more = held - conn.held
        if more > 0:
            if not self.memory.take(more):
                if parser.head_held:
                    return ParseError(503, "no room for more request heads (--max-request-memory)")
                self.memory.charge(more)
        elif more < 0:
            self.memory.give_back(-more)
        conn.held = held
        return None

    def _reject(self, conn: Conn, status: int) -> None:
        try:
            conn.sock.send(simple_response(status))
        except OSError:
            pass
        self._close(conn, answered=True)

    def _advance(self, conn: Conn, events: Sequence[Step]) -> bool:
        """Handle parsed events in order; True when the connection was dispatched or closed."""
        i = 0
        n = len(events)
        while i < n:
            event = events[i]
            i += 1
            if type(event) is Request:
                conn.request = event
                conn.continued = False
                if event.content_length or event.chunked:  # the body deadline runs from here
                    conn.phase = _BODY
                    conn.since = time.monotonic()
                    conn.received = 0
            elif type(event) is ParseError:  # after the responses to the requests before it
                self._reject(conn, event.status)
                return True
            elif type(event) is Body:
                if conn.body is None:
                    length = conn.request.content_length if conn.request is not None else None
                    conn.body = BodyBuffer(self.spool, self.spool_budget, length, self.memory)
                try:
                    conn.body.write(event.data)
                except ParseError as e:  # the spool: 413 or 503 (its cap), 507 (its disk is full)
                    self._reject(conn, e.status)
                    return True
                conn.received += len(event.data)
            else:
                request = conn.request
                conn.request = None
                conn.phase = _IDLE
                if request is None:  # pragma: no cover - parser contract
                    continue
                if conn.body is not None:
                    try:
                        stream = conn.body.finish()
                    except ParseError as e:  # the spool's disk is full
                        self._reject(conn, e.status)
                        return True
                    conn.body = None
                else:
                    stream = EMPTY_INPUT
                if self.pool is not None:
                    if request.websocket:
                        self._refuse_websocket(conn, request)
                        return True
                    if self.health is not None and self.health.check(request):
                        if self._health(conn, request):
                            continue
                        self._close(conn, answered=True)
                        return True
                    self._dispatch(conn, request, stream, events[i:])
                    return True
                keep = self._respond(conn, request, stream, events[i:])
                if not keep:
                    if keep is not None:
                        self._close(conn, answered=True)
                    return True  # closed, or writing: the rest waits until the response is out
        # everything parsed so far is handled: wait for more bytes
        request = conn.request
        if request is not None:  # head in, body still coming (phase BODY since the head ended)
            if request.expect_continue and not conn.continued:
                conn.continued = True
                try:
                    conn.out.send(CONTINUE)
                except OSError:
                    self._close(conn)
                    return True
        elif conn.parser.in_message:  # part of a head: the slowloris clock runs
            if conn.phase is not _HEAD:
                conn.phase = _HEAD
                conn.since = time.monotonic()
        else:
            conn.phase = _IDLE
            conn.since = time.monotonic()
        return False

    def _respond(
        self, conn: Conn, request: Request, stream: InputStream, rest: Sequence[Step]
    ) -> bool | None:
        """Run the app for one request and write its response.

        True to keep the connection, False to close it, None when the response now waits for the
        client to read (threads == 1: see _on_writable; `rest` is handled after it).
        """
        control = self.control
        if request.websocket:
            return self._refuse_websocket(conn, request)
        if self.health is not None and self.health.check(request) and self.pool is None:
            return self._health(conn, request)
        started = time.perf_counter() if self.access_log is not None else 0.0
        out = conn.out
        token = out.token = control.request_started(request.method, request.path)
        out.request = request
        writing = False
        outcome: Outcome | Streaming | None = None
        serving = deadlines.current.set(token)  # refork.extend_deadline() finds its request
        try:
            environ = conn.builder.build(request, stream, conn.client)
            keep_alive = self.timeouts.keep_alive(self.draining or control.stopping)
            app = self.app
            if self.request_hooks is not None:
                app = self.request_hooks.wrap_wsgi(app, request, environ)
            outcome = self.start_wsgi(app, environ, request, out, keep_alive)
            if type(outcome) is Streaming:
                writing = True
                self._start_writing(conn, Writing(outcome, request, environ, stream, token, started, rest))
                return None
        finally:
            deadlines.current.reset(serving)
            if not writing:  # (the same as finished(), inline: this is the hot path)
                answered = type(outcome) is tuple
                if answered and self.access_log is not None:
                    status, length, _ = outcome  # type: ignore[misc]
                    log_access(self.access_log, request, environ.get("REMOTE_ADDR"), status, length,
                               time.perf_counter() - started, environ, out.exchange.headers)  # fmt: skip
                control.request_finished(token, outcome[0] if answered else 0)  # type: ignore[index]
                if stream is not EMPTY_INPUT:
                    stream.close()
        return outcome[2]  # type: ignore[index]

    def _start_writing(self, conn: Conn, writing: Writing) -> None:
        """The response now waits for the client to read (threads == 1): see _on_writable."""
        self.control.request_waiting(writing.token)  # the client's time now, not the app's
        conn.writing = writing
        conn.phase = _WRITING
        conn.since = time.monotonic()
        self.in_flight += 1  # no safe point (fork) while a response body is half pulled
        self.poller.watch(conn.fd, conn.out.wants)  # OUT; TLS: IN when OpenSSL must read first
        if conn.tls is not None:
            conn.tls.polled = conn.out.wants

    def _refuse_websocket(self, conn: Conn, request: Request) -> bool:
        """A WebSocket handshake (see _WEBSOCKET_REFUSED): answered here, logged, then closed."""
        response = simple_response(400, _WEBSOCKET_REFUSED)
        try:
            conn.sock.send(response)
        except OSError:
            pass
        if self.access_log is not None:
            remote = conn.client[0] if isinstance(conn.client, tuple) else None
            log_access(self.access_log, request, remote, 400, len(_WEBSOCKET_REFUSED), 0.0)
        if self.pool is not None:
            self._close(conn, answered=True)
        return False

    def _health(self, conn: Conn, request: Request) -> bool:
        """Answer a --health-path check on the loop thread (no app, no count, no access log);
        True to keep the connection."""
        control = self.control
        kind = self.health.check(request) if self.health is not None else None
        keep = request.keep_alive and self.timeouts.keep_alive(self.draining or control.stopping)
        data = health_response(control.health(kind or "live"), request.method, keep)
        try:
            return conn.sock.send(data) == len(data) and keep
        except OSError:
            return False

    def finished(self, request: Request, environ: dict[str, Any], stream: InputStream, token: object,
                  started: float, outcome: Outcome, ex: _Exchange) -> bool:  # fmt: skip
        """A response is done: log it and account it (`ex`: its state); True to keep the connection.
        The line first: gunicorn's post_request hook runs there, inside the request's --timeout."""
        status, length, keep = outcome
        if self.access_log is not None:
            log_access(self.access_log, request, environ.get("REMOTE_ADDR"), status, length,
                       time.perf_counter() - started, environ, ex.headers)  # fmt: skip
        self.control.request_finished(token, status)
        if stream is not EMPTY_INPUT:
            stream.close()
        return keep

    def _on_writable(self, conn: Conn) -> None:
        """The client read some of a waiting response: write on, and pull more of the body."""
        writing = conn.writing
        assert writing is not None
        conn.since = time.monotonic()  # progress: the write timeout counts from here
        try:
            if not conn.out.write_some():
                if conn.tls is not None:
                    self._tls_rewatch(conn)
                return
        except OSError:
            self._close(conn)  # the client is gone
            return
        control = self.control
        control.request_resumed(writing.token)
        serving = deadlines.current.set(writing.token)
        try:
            outcome = writing.streaming.resume()
        except Exception:
            log.exception("Error serving a connection")
            self._close(conn)
            return
        finally:
            deadlines.current.reset(serving)
        if outcome is None:
            control.request_waiting(writing.token)
            if conn.tls is not None:
                self._tls_rewatch(conn)
            return
        if not self._settle(conn, writing, outcome) or conn.closed:
            self._close(conn, answered=True)
            return
        conn.phase = _IDLE
        conn.since = time.monotonic()
        self.poller.watch(conn.fd, _IN)
        if conn.tls is not None:
            conn.tls.polled = _IN
        try:
            if not self._advance(conn, writing.rest):  # pipelined requests behind this one
                self.beside.take_back(conn)
        except Exception:
            log.exception("Error serving a connection")
            self._close(conn)

    def _tls_rewatch(self, conn: Conn) -> None:
        """A blocked TLS write may wait for a read (OUT <-> IN): poll what it waits for."""
        tconn = conn.tls
        assert tconn is not None
        if conn.out.wants != tconn.polled:
            tconn.polled = conn.out.wants
            self.poller.watch(conn.fd, tconn.polled)

    def _settle(self, conn: Conn, writing: Writing, outcome: Outcome) -> bool:
        """A waiting response is done (or abandoned): the request's bookkeeping; True to keep."""
        conn.writing = None
        conn.out.clear()
        self.in_flight -= 1
        return self.finished(writing.request, writing.environ, writing.stream, writing.token,
                              writing.started, outcome, writing.streaming.ex)  # fmt: skip


def serve_wsgi(listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
               settings: ServingSettings) -> None:  # fmt: skip
    """Serve WSGI on these listeners until the control says stop (see WorkerControl)."""
    PythonLoop(listeners, app, config, control, settings).run()
