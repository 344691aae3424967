"""The Python loop's connections and their request path: read, parse, call the app, write.

Idle keep-alive and slow clients cost a dict entry, never a thread: only complete requests (head
and whole body) reach the app. With ``threads == 1`` the app runs on the loop thread (the lean
path: one recv and one send per request); a response the client does not read as fast as it is
produced becomes a writer state of its connection (:mod:`refork.serving.outbox`): the loop
serves other connections and pulls the next body item only when the socket took the last one.
With more threads, a connection is unregistered while an app thread serves it (and may block on
its writes, bounded by the write timeout) and handed back (:mod:`refork.serving.wsgi.app_handoff`).

:class:`RequestPath` is also the loop an HTTP/2 session sees (refork.serving.wsgi.roles.SessionLoop);
the loop that owns it (:mod:`refork.serving.wsgi.python_loop`) accepts, sweeps, drains and stops.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from refork import deadlines
from refork.config import Config
from refork.http.body import EMPTY_INPUT, BodyBuffer, InputStream, Spool
from refork.http.events import Body, EndOfMessage, ParseError, Request
from refork.http.proxy_protocol import ProxyError
from refork.http.response import CONTINUE, simple_response
from refork.serving.connection import Phase, RequestEnd, log_access, release_after_fork
from refork.serving.contract import WorkerControl
from refork.serving.http2 import http2_limits
from refork.serving.lingering import Lingering
from refork.serving.poller import IN as _IN
from refork.serving.poller import Poller
from refork.serving.proxied import peer_host, refuse
from refork.serving.settings import ServingSettings
from refork.serving.tls_io import TlsConn, log_failure
from refork.serving.wsgi.app_handoff import AppHandoff
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.beside import Beside
from refork.serving.wsgi.conn import NO_EVENTS, Conn, LoopParts, Step, Writing
from refork.serving.wsgi.http2 import Session, sniff, take_over
from refork.serving.wsgi.http2_stream import Stream
from refork.serving.wsgi.own_answers import answer_health, refuse_websocket
from refork.wsgi import Outcome, Streaming
from refork.wsgi.response import _Exchange

log = logging.getLogger("refork")

_IDLE, _HEAD, _BODY, _WRITING = Phase.IDLE, Phase.HEAD, Phase.BODY, Phase.WRITING


def _kept(conn: Conn) -> bool:
    return False  # (take_back, with nothing beside the loop: it keeps every connection)


class RequestPath:
    """The loop's connections (by fd), what they hold, and everything a request goes through."""

    # Slots: CPython 3.11 and 3.12 stop specializing attribute reads on an instance whose __dict__
    # holds 30 keys or more (every self.x of the per-request code then costs twice as much).
    __slots__ = (
        "app", "control", "settings", "start_wsgi", "read_size", "poller", "_scratch", "_scratch_view",
        "conns", "lingering", "draining", "in_flight", "spool", "spool_budget", "memory", "timeouts",
        "request_hooks", "access_log", "health", "proxy", "h1", "h2c", "h2_alpn", "h2_limits", "threads",
        "handoff", "pool", "beside", "take_back",
    )  # fmt: skip

    def __init__(
        self, app: Any, config: Config, control: WorkerControl, settings: ServingSettings, parts: LoopParts,
        poller: Poller, memory: Any, beside: Beside,
        app_threads: Callable[[int, Callable[..., None]], AppThreads],
    ) -> None:  # fmt: skip
        self.app = app
        self.control = control
        self.settings = settings
        self.start_wsgi = parts.start_wsgi
        self.read_size = settings.read_size
        self.poller = poller
        # one buffer every read lands in, copied out at its size: a 64 KiB bytes shrunk to what
        # arrived (recv) leaves the heap fragmented under many connections sending bodies at once
        self._scratch = bytearray(settings.read_size)
        self._scratch_view = memoryview(self._scratch)
        self.conns: dict[int, Conn] = {}
        self.lingering = Lingering(poller)  # the connections closed lingering (refork.serving.lingering)
        self.draining = False  # keep-alive is off, HTTP/2 sessions were sent GOAWAY (drain)
        self.in_flight = 0  # requests in the app or in an app thread's queue, responses being pulled
        self.spool = settings.inline_body
        self.spool_budget = Spool(config.max_spool, config.spool_dir)  # bytes in spool files, all conns
        self.memory = memory  # the worker's budget of request bytes held, all conns (--max-request-memory)
        self.timeouts = settings.timeouts
        self.request_hooks = settings.request_hooks  # pre_request / post_request, if any
        self.access_log: RequestEnd | None = settings.request_end
        self.health = settings.health
        self.proxy = settings.proxy
        self.h1, self.h2c = settings.h1, settings.h2c  # HTTP/2 (refork.serving.wsgi.http2): h2c, h2 by ALPN
        self.h2_alpn = "h2" in config.http_protocols and bool(settings.tls)
        self.h2_limits = http2_limits(config)
        self.threads = settings.threads
        self.handoff: AppHandoff | None = None
        self.pool: AppThreads | None = None
        if self.threads > 1:
            self.handoff = AppHandoff(self.threads, self._respond, app_threads)
            self.pool = self.handoff.pool
        self.beside = beside
        # a connection that may be between requests: True when it went back to the engine
        self.take_back: Callable[[Conn], bool] = self._hand_back if beside.hands_back else _kept

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

    def on_readable(self, conn: Conn) -> None:
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
        self.on_data(conn, data)

    def _read_preface(self, conn: Conn) -> bool:
        """The PROXY header at the start of a connection (Conn.read_proxy_header): True once it is
        read (or there is none); False: wait for more, or the connection is closed."""
        assert self.proxy is not None
        try:
            ready = conn.read_proxy_header(self.proxy)
        except ProxyError as e:
            refuse(conn.sock, peer_host(conn.client), e, conn.tls is not None)
            self._close(conn, answered=True)
            return False
        if ready is None:
            self._close(conn)
            return False
        return ready

    def on_data(self, conn: Conn, data: bytes) -> None:
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
                refused = conn.hold(self.memory)
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
                    self.take_back(conn)
                elif keep is not None:  # None: the response waits for the client to read
                    self._close(conn, answered=True)
            elif not self._advance(conn, events):
                self.take_back(conn)
        except Exception:
            log.exception("Error serving a connection")
            self._close(conn)

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
        client to read (threads == 1: see on_writable; `rest` is handled after it).
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
                self.start_writing(conn, Writing(outcome, request, environ, stream, token, started, rest))
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

    def start_writing(self, conn: Conn, writing: Writing) -> None:
        """The response now waits for the client to read (threads == 1): see on_writable."""
        self.control.request_waiting(writing.token)  # the client's time now, not the app's
        conn.writing = writing
        conn.phase = _WRITING
        conn.since = time.monotonic()
        self.in_flight += 1  # no safe point (fork) while a response body is half pulled
        self.poller.watch(conn.fd, conn.out.wants)  # OUT; TLS: IN when OpenSSL must read first
        if conn.tls is not None:
            conn.tls.polled = conn.out.wants

    def _refuse_websocket(self, conn: Conn, request: Request) -> bool:
        """A WebSocket handshake: refused (own_answers), then closed."""
        refuse_websocket(conn.sock, conn.client, request, self.access_log)
        if self.pool is not None:
            self._close(conn, answered=True)
        return False

    def _health(self, conn: Conn, request: Request) -> bool:
        """A --health-path check, answered here (own_answers); True to keep the connection."""
        kind = self.health.check(request) if self.health is not None else None
        keep = request.keep_alive and self.timeouts.keep_alive(self.draining or self.control.stopping)
        return answer_health(conn.sock, request, kind, self.control, keep)

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

    def on_writable(self, conn: Conn) -> None:
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
                self.take_back(conn)
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

    # ---------------------------------------------------------------- where connections go

    def add(self, conn: Conn, polled: bool = True) -> None:
        """A new connection (accepted, or an engine's): this path's; its reads polled if `polled`."""
        self.conns[conn.fd] = conn
        if polled:
            self.watch(conn)

    def watch(self, conn: Conn) -> None:
        """Poll the connection's reads (again: an app thread or an engine's response had it)."""
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

    close = _close  # (the loop's name for it; an HTTP/2 session's is _close)

    def _hand_back(self, conn: Conn) -> bool:
        """(take_back, with an engine beside the loop: a connection it takes is let go of, not closed.)"""
        listener = self.beside.listener_for(conn)
        if listener is None:
            return False
        if conn.registered:
            self.poller.unregister(conn.fd)
            conn.registered = False
        if self.conns.get(conn.fd) is conn:
            del self.conns[conn.fd]
        conn.closed = True  # (this loop is done with it: the engine has the fd)
        self.beside.hand_back(conn.sock.detach(), conn.client, listener, conn.since)
        return True

    def drain(self) -> None:
        """The worker stops: no more keep-alive; GOAWAY on HTTP/2 (its streams finish, then it closes)."""
        self.draining = True
        for session in [c.h2 for c in self.conns.values() if c.h2 is not None]:
            session.stop()

    def forked(self) -> None:
        """In the forked child of a safe point: the client connections are the parent's."""
        release_after_fork([*self.conns, *self.lingering.fds()])
        self.conns.clear()
        self.lingering.forget()

    def shutdown(self) -> None:
        """Release the connections. No epoll unregister: in a forked child it is shared."""
        for conn in list(self.conns.values()):
            if conn.busy:
                continue  # an app thread may still write to it (exit_now): process exit closes it
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
        if self.handoff is not None:
            self.handoff.close()

    # ---------------------------------------------------------------- the app threads (threads > 1)

    def _dispatch(self, conn: Conn, request: Request, stream: InputStream, rest: Sequence[Step],
                  force: bool = False) -> None:  # fmt: skip
        if conn.registered:
            self.poller.unregister(conn.fd)
            conn.registered = False
        assert self.handoff is not None
        conn.busy = True
        if not force and self.control.safe_point_wanted:
            self.handoff.park((conn, request, stream, rest))  # hold it until the safe point
            return
        self.in_flight += 1
        self.handoff.pool.submit((conn, request, stream, rest))

    def h2_dispatch(self, stream: Stream, force: bool = False) -> None:
        """An HTTP/2 stream's app call for the app threads (held for a safe point, as a request is)."""
        assert self.handoff is not None
        if not force and self.control.safe_point_wanted:
            self.handoff.park_stream(stream)
            return
        self.in_flight += 1
        self.handoff.pool.submit((stream, None, None, None))  # (AppHandoff._job: stream.run())

    def h2_kick(self, session: Session) -> None:
        """From an app thread: an HTTP/2 connection has bytes to send, or a call ended."""
        assert self.handoff is not None
        self.handoff.kick(session)

    def dispatch_parked(self) -> None:
        """The requests held for a safe point go to the app threads (it was taken, or declined)."""
        assert self.handoff is not None
        parked, streams = self.handoff.unpark()
        for conn, request, stream, rest in parked:
            self._dispatch(conn, request, stream, rest, force=True)
        for h2_stream in streams:
            self.h2_dispatch(h2_stream, force=True)

    def on_wake(self) -> None:
        """What the app threads handed back: HTTP/2 news, and connections whose request is answered."""
        handoff = self.handoff
        assert handoff is not None
        handoff.woken()
        while True:  # HTTP/2 connections whose app threads have bytes to send or calls ended
            try:
                session = handoff.kicked.get_nowait()
            except queue.Empty:
                break
            session.service()
        while True:
            try:
                conn, keep, rest = handoff.done.get_nowait()
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
            if not self.take_back(conn):
                self.poller.register(conn.fd)
                conn.registered = True
