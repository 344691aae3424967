"""The ASGI loop's per-connection protocol: parse, queue pipelined requests, run them in order.

:class:`HttpProtocol` feeds bytes to the sans-IO :class:`RequestParser`, hands each complete request
head to a :class:`refork.asgi.HttpCycle` (which runs the app on a Task) and is that cycle's
:class:`refork.asgi.Channel`. It keeps the connection's flow control (pausing reads behind a
backlog, writes over the transport's high-water mark) and applies the deadlines of
:mod:`refork.serving.connection` when :class:`refork.serving.asgi.server.Server` sweeps it once a second.
The server side (listening, the graceful stop, safe points and the fork clean-up) is in
:mod:`refork.serving.asgi.server`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from refork import deadlines
from refork.asgi import HttpCycle, build_scope
from refork.asgi.scope import http_scope
from refork.asgi.tls import tls_extension
from refork.asgi.waiting import wake
from refork.http.budget import charge_parser
from refork.http.events import Body, Event, ParseError, Request
from refork.http.response import simple_response
from refork.serving.asgi.http2_protocol import HOLD_POLL, hand_over, wants_h2
from refork.serving.asgi.sendfile import send_file
from refork.serving.asgi.tls_buffers import PIECE, close_refused, feed_tls, hold_tls_reads
from refork.serving.asgi.websocket_protocol import WebSocketProtocol
from refork.serving.connection import Expiry, Phase, Timeouts, log_access, log_write_timeout
from refork.serving.health import health_response
from refork.serving.http2 import LINGER, sniff_preface
from refork.serving.parsers import request_parser

if TYPE_CHECKING:
    from refork.serving.asgi.roles import Host

log = logging.getLogger("refork")

MAX_PIPELINE = 32  # queued pipelined requests before we stop reading the socket
_IDLE, _HEAD, _BODY = Phase.IDLE, Phase.HEAD, Phase.BODY


class HttpProtocol(asyncio.Protocol):
    """One client connection: parse, queue pipelined requests, run them in order.

    It drives each request's :class:`HttpCycle` (body pieces, end of body, client gone, writable
    again) and is the cycle's :class:`refork.asgi.Channel`: the calls it answers through.
    """

    __slots__ = (
        "srv", "loop", "parser", "transport", "server_addr", "client_addr", "cycle", "reading",
        "queue", "read_paused", "write_blocked_since", "closing", "since", "pending_error", "eof",
        "trusted", "body_bytes", "scheme", "tls", "fresh", "drain_waiter", "held", "proxied", "sniffed",
        "hold_head", "hold_timer", "linger_since", "unsent", "flushing", "__weakref__",
    )  # fmt: skip

    def __init__(self, srv: Host, proxied: tuple[str, int] | None = None) -> None:
        self.srv = srv
        self.proxied = proxied  # the client a PROXY header named (refork.serving.asgi.proxied_listener)
        self.loop = srv.loop
        self.parser = request_parser(srv.limits, hand_off_websocket=srv.ws_enabled)
        self.transport: Any = None
        self.server_addr: tuple[str, int | None] | None = None
        self.client_addr: tuple[str, int] | None = None
        self.cycle: HttpCycle | None = None  # the request the app is working on
        self.reading: HttpCycle | None = None  # the request whose body is still arriving
        self.queue: deque[HttpCycle] = deque()
        self.read_paused = False
        self.write_blocked_since = 0.0  # when the transport's buffer filled up; 0: it did not
        self.closing = False
        self.since = srv.loop.time()  # start of the current Phase (see sweep())
        self.pending_error = 0
        self.eof = False
        self.trusted = False
        self.body_bytes = 0  # of the request being received: each --body-min-rate extends its deadline
        self.scheme = "http"  # "https" on a TLS listener (asyncio / uvloop did the handshake)
        self.tls: dict[str, Any] | None = None  # the `tls` scope extension of a TLS connection
        self.fresh = True  # no byte received yet (see Timeouts.expiry)
        self.drain_waiter: asyncio.Future[None] | None = None  # send_file() waits for resume_writing
        self.held = 0  # what the parser holds, charged to the worker's --max-request-memory
        self.sniffed = b""  # h2c: the first bytes, while they may be the HTTP/2 preface
        # the Channel's hold_head is the server's own: no call in between
        self.hold_head: Callable[[HttpCycle], None] = srv.hold_head
        self.hold_timer: asyncio.TimerHandle | None = None  # a request held for a safe point
        self.linger_since = 0.0  # the write side is shut: what the client still sends is dropped
        self.unsent: list[memoryview] = []  # TLS: response bytes not handed to the SSL layer yet (feed_tls)
        self.flushing = False  # TLS: closes once what it wrote is out (see close())

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if getattr(transport, "max_size", None) == 256 * 1024:
            # What a connection reads at once, so what one let read may take. uvloop reads 64 KiB
            # (ServingSettings.read_size); asyncio's plain transport 256 KiB into a new bytes
            # object each time, cut down to what came: held to the read size too (one read more
            # per connection when the budget fills, and less heap churn: measured, a flood of 300
            # uploads peaked about 15 MiB lower).
            transport.max_size = self.srv.read_size
        sockname = transport.get_extra_info("sockname")
        if isinstance(sockname, tuple):
            self.server_addr = (sockname[0], sockname[1])
            peer = transport.get_extra_info("peername")
            self.client_addr = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        else:  # AF_UNIX: path (str or bytes) and no client address
            if isinstance(sockname, bytes):
                sockname = sockname.decode("utf-8", "surrogateescape")
            self.server_addr = (sockname or "", None)
        if self.proxied is not None:
            self.client_addr = self.proxied
        proxies = self.srv.proxies  # a unix-socket peer (no client address) is None to trusts()
        self.trusted = proxies is not None and proxies.trusts(self.client_addr and self.client_addr[0])
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            self.scheme = "https"
            self.tls = tls_extension(ssl_object)
            hold_tls_reads(transport)
        self.srv.arriving.discard(self)
        self.srv.handshaking.discard(self)
        self.srv.connections.add(self)
        if ssl_object is not None and self.srv.h2_alpn and wants_h2(transport):
            hand_over(self, b"")  # ALPN picked HTTP/2 (refork.serving.asgi.http2_protocol)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return  # (a refused TLS client's last bytes: dropped, see close_refused)
        if self.fresh and self.tls is None and self.srv.h2c:
            data = self.sniff(data)
            if not data:
                return
        self.fresh = False
        if self.cycle is None and not self.parser.in_message:
            self.since = self.loop.time()  # a head starts: the header clock runs
        parser = self.parser
        try:
            events = parser.feed(data)
        except ParseError as exc:
            self.srv.request_memory.note(len(data))  # (its bytes went through, if only to be refused)
            self.handle(exc.events)  # the requests before the bad one are answered first
            self.parse_failed(exc)
            return
        except Exception:
            log.exception("error parsing a request")
            self.parse_failed(ParseError(400, "unparsable request"))
            return
        if self.held or parser.in_message:
            refused = self.hold()
            if refused is not None:
                self.handle(events)
                self.parse_failed(refused)
                return
        self.handle(events)

    def sniff(self, data: bytes) -> bytes:
        """h2c: a cleartext connection that opens with the HTTP/2 preface is served HTTP/2; b"" while
        the bytes may still be the preface, or once handed over. Without h1, anything else is closed."""
        seen = self.sniffed + data
        verdict = sniff_preface(seen)
        if verdict is None:
            self.sniffed = seen
            return b""
        self.sniffed = b""
        if verdict:
            hand_over(self, seen)
            return b""
        if not self.srv.h1:  # (prior knowledge only: the client was to open with the preface)
            self.fresh = False
            self.close()
            return b""
        return seen

    def hold(self) -> ParseError | None:
        """Charge what the parser holds now to the worker's --max-request-memory; a head that does
        not fit is refused (503), other bytes (kept for a replay) are charged all the same."""
        parser = self.parser
        held = parser.buffered if parser.in_message and not self.closing else 0
        refused = charge_parser(self.srv.request_memory, self.held, held, parser.head_held)
        if refused is None:
            self.held = held
        return refused

    def handle(self, events: list[Event]) -> None:
        for event in events:
            kind = type(event)
            if kind is Body:
                self.body_bytes += len(event.data)  # type: ignore[union-attr]
                if self.reading.body_received(event.data):  # type: ignore[union-attr]
                    self.pause_reading()
            elif kind is Request:
                request: Request = event  # type: ignore[assignment]
                srv = self.srv
                if request.websocket and srv.ws_enabled:
                    self.upgrade(request)
                    return  # the parser stopped after it: the rest is the WebSocket's
                memory = srv.request_memory
                cycle = HttpCycle(self, self.loop, request, keep_alive=srv.timeouts.keep_alive(srv.stopping),
                                  memory=memory)
                self.reading = cycle
                if request.content_length or request.chunked:
                    self.since = self.loop.time()  # the body deadline runs from the end of the head
                    self.body_bytes = 0
                if self.cycle is None and not self.queue and not self.write_blocked_since:
                    self.start(cycle)
                else:
                    self.queue.append(cycle)
                    if len(self.queue) > MAX_PIPELINE:
                        self.pause_reading()
            else:
                self.reading.end_received()  # type: ignore[union-attr]
                self.reading = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        srv = self.srv
        srv.connections.discard(self)
        srv.request_memory.cancel(self)
        self.let_go()
        if self.cycle is not None:
            self.cycle.client_gone()
        self.queue.clear()
        self.reading = None
        self.write_blocked_since = 0.0
        self.unsent.clear()
        if self.hold_timer is not None:
            self.hold_timer.cancel()
            self.hold_timer = None
        self._wake_drain()
        if srv.stopping and not srv.connections:
            srv.check_drained()

    def pause_writing(self) -> None:
        self.write_blocked_since = self.loop.time()

    def resume_writing(self) -> None:
        self.write_blocked_since = 0.0
        if self.unsent and not feed_tls(self):
            return  # (TLS) paused again: the rest waits for the next resume
        if self.flushing:
            self.flush_then_close()
            return
        self._wake_drain()
        if self.cycle is not None:
            self.cycle.resume_sending()
        elif self.queue and not self.closing:
            self.start_next()

    def eof_received(self) -> bool | None:
        # Half-close from the client: finish what is queued, then close (returning None closes).
        self.eof = True
        if self.closing:
            return None  # the lingering close is over
        if self.cycle is None and not self.queue:
            self.closing = True
            return None
        reading = self.reading
        if reading is not None:
            # The body can never complete: to the app this is a disconnect.
            reading.client_gone()
            self.queue.clear()
        else:  # whole requests: their receive() says http.disconnect now (long polls end at once)
            if self.cycle is not None:
                self.cycle.peer_closed()
            for queued in self.queue:
                queued.peer_closed()
        return True

    # The Channel of the running cycle --------------------------------------------------------

    def write(self, data: bytes) -> bool:
        if self.closing:
            return True  # nothing goes out any more: nothing to wait for either
        if self.tls is not None and (self.unsent or len(data) > PIECE):
            self.unsent.append(memoryview(data if isinstance(data, bytes) else bytes(data)))
            return feed_tls(self)
        self.transport.write(data)
        return not self.write_blocked_since

    def body_taken(self) -> None:
        if self.read_paused:
            self.maybe_resume_reading()

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        return await send_file(self, fd, offset, count)

    async def wait_writable(self) -> None:
        """Until resume_writing() (or the connection is lost)."""
        waiter = self.drain_waiter = self.loop.create_future()
        await waiter

    def _wake_drain(self) -> None:
        waiter, self.drain_waiter = self.drain_waiter, None
        wake(waiter)

    def cycle_done(self, cycle: HttpCycle, keep_alive: bool) -> None:
        """The response is written (or abandoned): account for it and move on to the next one."""
        srv = self.srv
        srv.in_flight -= 1
        srv.control.request_finished(cycle.token, cycle.response.status)
        if srv.access_log is not None:
            response = cycle.response
            log_access(srv.access_log, cycle.request, cycle.remote, response.status, response.body_bytes,
                       self.loop.time() - cycle.started_at, None, response.headers)  # fmt: skip
        if srv.request_hooks is not None:
            response = cycle.response
            srv.request_hooks.after_asgi(cycle.hook_request, cycle.request, cycle.remote, response.status,
                                         response.body_bytes, response.headers)  # fmt: skip
        if self.cycle is cycle:
            self.cycle = None
        if not keep_alive or self.closing or srv.stopping or (self.eof and not self.queue):
            self.close()
        else:
            self.since = self.loop.time()
            if self.reading is cycle and self.read_paused:
                self.maybe_resume_reading()  # drain and drop the unread body
            if self.queue:
                if not self.write_blocked_since:
                    self.start_next()
            elif self.pending_error:
                self.send_error(self.pending_error)
        if srv.in_flight == 0 and (srv.stopping or srv.control.safe_point_wanted):
            srv.idle()

    def client_wait(self, cycle: HttpCycle, waiting: bool) -> None:
        control = self.srv.control
        if waiting:
            control.request_waiting(cycle.token)
        else:
            control.request_resumed(cycle.token)

    # Requests --------------------------------------------------------------------------------

    def upgrade(self, request: Request) -> None:
        """A WebSocket handshake: the transport goes to a WebSocketProtocol (serving.asgi.websocket_protocol)
        with the bytes after the head. Refused behind a pipelined response (400, once it is
        written) and while the worker stops (503)."""
        srv = self.srv
        if self.cycle is not None or self.queue:
            self.pending_error = 400
            self.pause_reading()
            return
        if srv.stopping:
            self.send_error(503)
            return
        proxies = srv.proxies if self.trusted else None
        scope_args = {"server": self.server_addr, "client": self.client_addr, "scheme": self.scheme,
                      "root_path": srv.root_path, "proxies": proxies, "tls": self.tls}  # fmt: skip
        ws = WebSocketProtocol(srv, self.transport, request, self.parser.upgraded or b"", scope_args,
                               self.read_paused)  # fmt: skip
        self.closing = True  # this protocol is done with the connection
        self.let_go()
        srv.connections.discard(self)
        srv.connections.add(ws)
        self.transport.set_protocol(ws)
        ws.start()

    def start(self, cycle: HttpCycle) -> None:
        srv = self.srv
        if srv.health is not None and srv.health.check(cycle.request):
            self.answer_health(cycle)
            return
        if srv.control.safe_point_wanted and srv.serving and not srv.stopping:
            # The worker is being promoted: a new request waits (a few seconds at most: the worker
            # declines past its bound) so that the ones in flight end and the safe point comes.
            self.queue.appendleft(cycle)
            if self.hold_timer is None:
                self.hold_timer = self.loop.call_later(HOLD_POLL, self.release_held)
            return
        if srv.stopping:
            cycle.close_after()
        self.cycle = cycle
        srv.in_flight += 1
        cycle.token = srv.control.request_started(cycle.request.method, cycle.request.path)
        proxies = srv.proxies if self.trusted else None
        scope = http_scope(cycle.request, server=self.server_addr, client=self.client_addr,
                           scheme=self.scheme, root_path=srv.root_path, state=srv.lifespan.state,
                           proxies=proxies) or build_scope(
            cycle.request,
            server=self.server_addr,
            client=self.client_addr,
            root_path=srv.root_path,
            proxies=proxies,
            state=srv.lifespan.state,
            scheme=self.scheme,
        )  # fmt: skip
        if self.tls is not None:
            scope["extensions"]["tls"] = self.tls.copy()
        app = srv.app
        if srv.access_log is not None or srv.request_hooks is not None:
            cycle.started_at = self.loop.time()
            client = scope["client"]
            cycle.remote = client[0] if client else None
            if srv.request_hooks is not None:  # gunicorn's pre_request (its error: the app's, a 500)
                cycle.hook_request, failed = srv.request_hooks.before_asgi(
                    cycle.request, tuple(client) if client else None, scope["scheme"]
                )
                app = failed or app
        serving = deadlines.current.set(cycle.token)  # the task copies it: refork.extend_deadline()
        cycle.task = self.loop.create_task(cycle.run(app, scope))
        deadlines.current.reset(serving)

    def release_held(self) -> None:
        """Start the request held for a safe point once it was taken or declined."""
        self.hold_timer = None
        if self.closing or self.cycle is not None or not self.queue or self.write_blocked_since:
            return  # (a cycle's end, or resume_writing, starts it)
        srv = self.srv
        if srv.control.safe_point_wanted and srv.serving and not srv.stopping:
            self.hold_timer = self.loop.call_later(HOLD_POLL, self.release_held)
        else:
            self.start_next()

    def answer_health(self, cycle: HttpCycle) -> None:
        """A --health-path check: answered here, never by the app; not counted, not logged."""
        srv, request = self.srv, cycle.request
        keep = request.keep_alive and srv.timeouts.keep_alive(srv.stopping or self.closing)
        kind = srv.health.check(request) if srv.health is not None else None
        self.transport.write(health_response(srv.control.health(kind or "live"), request.method, keep))
        if not keep:
            self.close()
            return
        self.since = self.loop.time()
        if self.queue and not self.write_blocked_since:
            self.start_next()

    def start_next(self) -> None:
        cycle = self.queue.popleft()
        if self.read_paused:
            self.maybe_resume_reading()
        self.start(cycle)

    def parse_failed(self, exc: ParseError) -> None:
        """Answer the requests before the bad bytes first, then the error, then close.

        When the bad bytes are in the body of a request (a malformed chunk, an endless trailer
        section), that request can never complete: its app sees http.disconnect, and the error
        is its answer if it has not started one (else the connection just closes).
        """
        reading = self.reading
        if reading is not None:
            self.reading = None
            if reading is self.cycle:
                reading.client_gone()
                if reading.response_started:
                    self.close()
                else:
                    reading.response.status = exc.status  # what the access log shows for it
                    self.send_error(exc.status)
                return
            if reading in self.queue:  # behind the running request: it never starts
                self.queue.remove(reading)
            else:  # answered already (its app did not wait for the body): nothing more to say
                self.close()
                return
        if self.cycle is not None or self.queue:
            self.pending_error = exc.status
            self.pause_reading()
        else:
            self.send_error(exc.status)

    def send_error(self, status: int) -> None:
        if not self.closing:
            self.transport.write(simple_response(status))
            self.close(refused=True)

    # Flow control, deadlines and closing -----------------------------------------------------

    def pause_reading(self) -> None:
        if not self.read_paused and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()
        reading = self.reading
        if reading is not None and self.srv.request_memory.full:
            self.srv.request_memory.wait(self, self.room_made, self.srv.read_size)

    def room_made(self) -> None:
        """The worker's --max-request-memory has room again (called from it): read on soon."""
        self.loop.call_soon(self.body_taken)

    def maybe_resume_reading(self) -> None:
        reading = self.reading
        if reading is not None and (reading.backlogged or self.srv.request_memory.full):
            if self.srv.request_memory.full:  # (not only its own backlog): when others make room
                self.srv.request_memory.wait(self, self.room_made, self.srv.read_size)
            return
        if len(self.queue) > MAX_PIPELINE or self.pending_error or self.closing:
            return
        self.read_paused = False
        self.transport.resume_reading()

    def close(self, refused: bool = False) -> None:
        """A lingering close (RFC 9112 9.6): what is written goes out, the write side shuts, and
        what the client still sends (a request sent as the worker retires, a body the app did not
        read) is read and dropped until it closes or LINGER passes (sweep()). Closing with its
        bytes unread would reset the connection: the client could lose the response it has not
        read yet, and a request it sent on a reused connection would meet ECONNRESET, not EOF."""
        if not self.closing:
            self.closing = True
            self.queue.clear()
            if refused:
                close_refused(self.transport, self.loop)
            elif self.tls is not None and (self.unsent or self.transport.get_write_buffer_size()):
                self.flushing = True
                if not self.unsent:
                    self.flush_then_close()
            elif self.eof or not self.transport.can_write_eof():  # (TLS: close_notify, bounded)
                self.transport.close()
            else:
                self.linger_since = self.loop.time()
                if self.read_paused:
                    self.read_paused = False
                    self.transport.resume_reading()
                self.transport.write_eof()
            self.let_go()

    def flush_then_close(self) -> None:
        """TLS: close once what was written is out of the SSL layer, or wait for resume_writing
        at an empty buffer: the close_notify exchange's bound (Server._tls) would cut what is not
        (a client that stops reading meets the write timeout meanwhile)."""
        if self.transport.get_write_buffer_size():
            self.transport.set_write_buffer_limits(high=1, low=0)
        else:
            self.flushing = False
            self.transport.close()

    def let_go(self) -> None:
        """Nothing more is parsed here: what the parser holds goes now, not at connection_lost
        (a loop iteration later, when a flood may have refused hundreds of heads at once)."""
        self.parser.release()
        if self.held:
            self.srv.request_memory.give_back(self.held)
            self.held = 0

    def stop(self) -> None:
        """Graceful stop: let the current response finish and then close.

        Idle connections are closed by sweep() when the drain grace ends (see
        refork.serving.connection).
        """
        if self.cycle is not None:
            self.cycle.close_after()
            self.queue.clear()

    def sweep(self, now: float, timeouts: Timeouts, drain_until: float) -> None:
        """Apply the connection contract's deadlines (once a second, from Server.tick)."""
        if timeouts.write_stalled(self.write_blocked_since, now):
            cycle = self.cycle
            log_write_timeout(timeouts.write, self.client_addr, cycle.request if cycle is not None else None)
            self.transport.abort()  # the client stopped reading: connection_lost follows
            return
        if self.closing:
            if self.linger_since and now - self.linger_since >= LINGER:
                self.transport.close()
            return
        reading = self.reading
        if reading is not None:
            phase = _BODY  # also while the app runs: it may be waiting in receive()
        elif self.cycle is not None or self.queue:
            return  # the app has it: the worker's --timeout applies
        elif self.parser.in_message:
            phase = _HEAD
        else:
            phase = _IDLE
        verdict = timeouts.expiry(phase, self.since, now, drain_until, self.body_bytes, self.fresh)
        if verdict is Expiry.CLOSE:
            self.close()
        elif verdict is Expiry.REQUEST_TIMEOUT:
            other = self.cycle is not None and self.cycle is not reading  # a pipelined predecessor
            if other or (reading is not None and reading.response_started):
                self.close()  # too late for a 408: a response is (being) written
            else:
                if reading is not None:
                    reading.response.status = 408  # what the access log shows for it
                self.send_error(408)
