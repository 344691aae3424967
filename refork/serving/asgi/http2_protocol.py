"""HTTP/2 on the ASGI loop: one :class:`Http2Protocol` per connection, one Task per stream.

An HTTP/1.1 :class:`refork.serving.asgi.http_protocol.HttpProtocol` hands its transport over
(:func:`hand_over`) when TLS's ALPN picked ``h2``, or when a cleartext connection opens with the
HTTP/2 preface and ``h2c`` is in ``--http-protocols`` (prior knowledge, RFC 9113 3.3). An
``Upgrade: h2c`` request is served as HTTP/1.1 (the upgrade is ignored, as RFC 9113 lets a server
do). The protocol rules, limits and attack budgets are the sans-IO :mod:`refork.http.h2`'s;
here are the socket, the tasks, the worker's counters and the connection contract
(:mod:`refork.serving.connection`): the keep-alive and header deadlines, the write timeout, the
drain, and GOAWAY when the worker stops (stop, reload, refork, max-requests).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from refork import deadlines
from refork.asgi import build_scope
from refork.http.h2 import (
    ConnectionEnded,
    ErrorCodes,
    Http2Connection,
    Http2Event,
    StreamBody,
    StreamEnded,
    StreamOpened,
    StreamReset,
    WindowOpened,
)
from refork.serving.asgi.http2_stream import Stream
from refork.serving.asgi.tls_buffers import close_refused
from refork.serving.connection import Expiry, Phase, Timeouts, log_access, log_write_timeout, peer_text
from refork.serving.http2 import LINGER, answer_here, charge_held, end_if_body_overdue

if TYPE_CHECKING:
    from refork.serving.asgi.roles import Host, Upgrading

log = logging.getLogger("refork")
HOLD_POLL = 0.05  # seconds between two looks at a request (a stream) held for a safe point


__all__ = ["Http2Protocol", "hand_over", "wants_h2"]


def wants_h2(transport: Any) -> bool:
    """ALPN picked h2 on this TLS connection."""
    ssl_object = transport.get_extra_info("ssl_object")
    return ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"


def hand_over(old: Upgrading, data: bytes) -> None:
    """The connection speaks HTTP/2 from here: an Http2Protocol takes the transport, with ``data``
    (the bytes read so far) as its first input."""
    srv = old.srv
    new = Http2Protocol(srv, old)
    old.closing = True  # the HTTP/1.1 side is done with the connection
    old.let_go()
    srv.connections.discard(old)
    srv.connections.add(new)
    old.transport.set_protocol(new)
    new.start(data)


class Http2Protocol(asyncio.Protocol):
    """One HTTP/2 connection: the sans-IO connection, its streams and their app tasks."""

    def __init__(self, srv: Host, old: Upgrading) -> None:
        self.srv = srv
        self.loop = srv.loop
        self.transport: Any = old.transport
        self.server_addr, self.client_addr = old.server_addr, old.client_addr
        self.scheme, self.tls, self.trusted = old.scheme, old.tls, old.trusted
        self.h2 = Http2Connection(srv.h2_limits, srv.loop.time, srv.control.http2_count)
        self.streams: dict[int, Stream] = {}
        self.write_blocked_since = 0.0
        self.read_paused = False  # while the client does not read its answers
        self.memory_paused = False  # while the worker's --max-request-memory is full
        self.closing = False
        self.since = srv.loop.time()  # when the connection last had no stream (keep-alive clock)
        self.fresh = True  # no request yet (the header deadline, as for HTTP/1.1's first head)
        self.goaway_sent = False
        self.refused = False  # refork ended it for a connection error: closed without close_notify
        self.linger_since = 0.0
        self.held = 0  # bytes h2 holds (a header block arriving), charged to --max-request-memory
        self.waiting: list[Stream] = []  # new streams held while the worker is being promoted
        self.wait_timer: asyncio.TimerHandle | None = None
        self.write_due = False  # a flush is scheduled (write_soon)

    def start(self, data: bytes) -> None:
        self.srv.control.http2_count("connections", 1)  # (connection_lost takes it back)
        self.h2.start()
        if self.srv.stopping:  # (a connection that began to speak HTTP/2 during the drain)
            self.stop()
        if data:
            self.data_received(data)
        else:
            self.flush()

    # asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        events = self.h2.receive(data)
        for event in events:
            self.handle(event)
        self.hold()
        self.flush()
        if self.h2.ended:
            self.srv.request_memory.note(len(data))  # (its bytes went through, if only to be refused)
            self.close()
        elif self.h2.going_away and not self.streams:  # (the final GOAWAY, on the PING's ACK)
            self.close()
        elif self.srv.request_memory.full and not self.memory_paused and not self.h2.head_arriving:
            # (a head arriving reads on: the next of its bytes that does not fit ends it, see hold())
            self.memory_paused = True  # body bytes held for the apps fill the worker's budget:
            self.reading()  # read on when there is room (each stream's window bounds the rest)
            self.srv.request_memory.wait(self, self.room_made, self.srv.read_size)

    def hold(self) -> None:
        """What h2 holds of the client's bytes, charged to the worker's budget (charge_held)."""
        if self.h2.ended or self.closing:
            return  # (what it holds is given back once the connection is lost, its buffers with it)
        self.held, ended = charge_held(self.h2, self.srv.request_memory, self.held)
        if ended is not None:
            self.handle(ended)

    def hold_body(self, n: int) -> None:
        """Body bytes buffered for an app: charged to the worker's --max-request-memory."""
        self.srv.request_memory.charge(n)

    def release(self, n: int) -> None:
        self.srv.request_memory.give_back(n)

    def room_made(self) -> None:
        self.loop.call_soon(self._read_on)

    def _read_on(self) -> None:
        if self.srv.request_memory.full and not self.closing:
            self.srv.request_memory.wait(self, self.room_made, self.srv.read_size)
            return
        self.memory_paused = False
        self.reading()

    def reading(self) -> None:
        """Pause or resume reading the socket as the two reasons to pause say."""
        if self.closing:
            return
        if self.read_paused or self.memory_paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

    def handle(self, event: Http2Event) -> None:
        kind = type(event)
        if kind is StreamBody:
            assert isinstance(event, StreamBody)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.body_received(event.data)
        elif kind is StreamOpened:
            assert isinstance(event, StreamOpened)
            self.open(event)
        elif kind is StreamEnded:
            assert isinstance(event, StreamEnded)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.end_received()
        elif kind is WindowOpened:
            assert isinstance(event, WindowOpened)
            if event.stream_id:
                stream = self.streams.get(event.stream_id)
                if stream is not None:
                    stream.window_opened()
            else:
                for stream in list(self.streams.values()):
                    stream.window_opened()
        elif kind is StreamReset:
            assert isinstance(event, StreamReset)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.reset()
        elif kind is ConnectionEnded:
            assert isinstance(event, ConnectionEnded)
            if not event.by_client and event.code:  # an attack: warning; a broken client: debug
                self.refused = True
                level = logging.WARNING if event.code == ErrorCodes.ENHANCE_YOUR_CALM else logging.DEBUG
                peer = peer_text(self.client_addr)
                log.log(level, "HTTP/2 connection from %s ended: %s", peer, event.reason)
            for stream in list(self.streams.values()):
                if event.by_client and stream.sid <= event.last_stream_id:
                    continue  # a graceful GOAWAY from the client: its streams still finish
                stream.reset()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        srv = self.srv
        srv.connections.discard(self)
        srv.request_memory.cancel(self)
        for stream in list(self.streams.values()):
            stream.reset()
        self.h2.release()
        if self.held:
            srv.request_memory.give_back(self.held)
            self.held = 0
        srv.control.http2_count("connections", -1)
        if srv.stopping and not srv.connections:
            srv.check_drained()

    def pause_writing(self) -> None:
        self.write_blocked_since = self.loop.time()
        if not self.read_paused and not self.closing:  # a client that does not read gets no more
            self.read_paused = True  # answers (PING and SETTINGS acks) queued either
            self.reading()

    def resume_writing(self) -> None:
        self.write_blocked_since = 0.0
        if self.read_paused and not self.closing:
            self.read_paused = False
            self.reading()
        for stream in list(self.streams.values()):
            stream.window_opened()

    def eof_received(self) -> bool | None:
        if self.closing:
            return None  # the lingering close is over
        for stream in list(self.streams.values()):
            if not stream.body_done:
                stream.reset()  # a body that can never complete
        if not self.streams:
            return None  # close
        return True  # answer the streams that have their requests, then close

    # Streams ---------------------------------------------------------------------------------

    def open(self, event: StreamOpened) -> None:
        srv, request = self.srv, event.request
        self.fresh = False
        if event.refused:
            self.refuse(event.stream_id, event.refused)
            return
        kind = srv.health.check(request, event.ended) if srv.health is not None else None
        if kind is not None:  # --health-path: answered here, never by the app; not counted, not logged
            self.refuse(event.stream_id, srv.control.health(kind), request.method == "HEAD", health=True)
            return
        stream = Stream(self, event.stream_id, request, event.ended)
        self.streams[event.stream_id] = stream
        if srv.control.safe_point_wanted and srv.serving and not srv.stopping:
            # The worker is being promoted: a new stream waits (its body arrives meanwhile), as a new
            # HTTP/1.1 request does, so that the ones in flight end and the safe point comes.
            self.waiting.append(stream)
            if self.wait_timer is None:
                self.wait_timer = self.loop.call_later(HOLD_POLL, self.release_waiting)
            return
        self.begin(stream)

    def release_waiting(self) -> None:
        """Start the streams held for a safe point once it was taken or declined."""
        srv = self.srv
        if srv.control.safe_point_wanted and srv.serving and not srv.stopping:
            self.wait_timer = self.loop.call_later(HOLD_POLL, self.release_waiting)
            return
        self.wait_timer = None
        waiting, self.waiting = self.waiting, []
        for stream in waiting:
            self.begin(stream)  # (one the client reset meanwhile: its app hears the disconnect)

    def begin(self, stream: Stream) -> None:
        """The app's task for a stream (counted in flight)."""
        srv, request = self.srv, stream.request
        srv.in_flight += 1
        stream.token = srv.control.request_started(request.method, request.path)
        scope = build_scope(
            request, server=self.server_addr, client=self.client_addr, root_path=srv.root_path,
            proxies=srv.proxies if self.trusted else None, state=srv.lifespan.state, scheme=self.scheme,
        )  # fmt: skip
        scope["http_version"] = "2"
        if self.tls is not None:
            scope["extensions"]["tls"] = self.tls.copy()
        del scope["extensions"]["http.response.zerocopysend"]  # (no sendfile() under HTTP/2 framing)
        app = srv.app
        if srv.access_log is not None or srv.request_hooks is not None:
            stream.started_at = self.loop.time()
            client = scope["client"]
            stream.remote = client[0] if client else None
            if srv.request_hooks is not None:
                stream.hook_request, failed = srv.request_hooks.before_asgi(
                    request, tuple(client) if client else None, scope["scheme"]
                )
                app = failed or app
        serving = deadlines.current.set(stream.token)
        stream.task = self.loop.create_task(stream.run(app, scope))
        deadlines.current.reset(serving)

    def refuse(self, sid: int, status: int, head_only: bool = False, health: bool = False) -> None:
        answer_here(self.h2, sid, status, head_only, health)

    def stream_done(self, stream: Stream) -> None:
        """The app's task ended (response complete, abandoned or reset): account for it."""
        srv = self.srv
        if self.streams.pop(stream.sid, None) is None:
            return
        stream.let_go()  # (a body the app did not read)
        if not stream.body_done and not stream.gone and not self.closing:
            self.h2.reset(stream.sid, 0)  # answered before its body came: the rest is not wanted
        self.write_soon()
        srv.in_flight -= 1
        srv.control.request_finished(stream.token, stream.status)
        srv.control.http2_count("requests", 1)
        request = stream.request
        if srv.access_log is not None:
            log_access(srv.access_log, request, stream.remote, stream.status, stream.body_bytes,
                       self.loop.time() - stream.started_at, None, stream.headers)  # fmt: skip
        if srv.request_hooks is not None:
            srv.request_hooks.after_asgi(stream.hook_request, request, stream.remote, stream.status,
                                         stream.body_bytes, stream.headers)  # fmt: skip
        if not self.streams:
            self.since = self.loop.time()
            if self.h2.going_away or self.h2.ended:
                self.close()
        if srv.in_flight == 0:
            srv.idle()

    async def wait_on_client(self, stream: Stream, waiter: asyncio.Future[None]) -> None:
        """Wait for the client (body bytes, window, write room): not the app's time (--timeout)."""
        control = self.srv.control
        control.request_waiting(stream.token)
        try:
            await waiter
        finally:
            control.request_resumed(stream.token)

    def body_consumed(self, stream: Stream, n: int) -> None:
        if not self.closing:
            self.h2.body_consumed(stream.sid, n)
            self.write_soon()

    def send_head(self, stream: Stream, end_stream: bool) -> None:
        if not self.closing:
            self.h2.respond(stream.sid, stream.status, stream.headers, end_stream)
            self.write_soon()

    def send_hints(self, stream: Stream, links: list[bytes]) -> None:
        """A 103 Early Hints (an informational HEADERS frame) before the stream's response."""
        if not self.closing:
            self.h2.informational(stream.sid, 103, [(b"link", link) for link in links])
            self.write_soon()

    def send_body(self, stream: Stream, data: memoryview, end: bool) -> int:
        if self.closing:
            stream.gone = True
            return len(data)
        sent = self.h2.send_body(stream.sid, data, end)
        if sent < len(data):  # (the protocol's send buffer may be full until it is written out)
            self.flush()
            sent += self.h2.send_body(stream.sid, data[sent:], end)
        self.write_soon()
        return sent

    def send_trailers(self, stream: Stream, headers: list[tuple[bytes, bytes]]) -> None:
        if not self.closing:
            self.h2.send_trailers(stream.sid, headers)
            self.write_soon()

    def reset_stream(self, stream: Stream, code: int) -> None:
        if not self.closing:
            self.h2.reset(stream.sid, code)
            self.write_soon()

    # Writing, deadlines, stopping ------------------------------------------------------------

    def flush(self) -> None:
        """Write what the connection has to say, now."""
        self.write_due = False
        data = self.h2.data_to_send()
        if data and not self.closing:
            self.transport.write(data)

    def write_soon(self) -> None:
        """What the streams say goes out once the loop's ready callbacks have run: the streams
        answered in one loop iteration share one send() (a send each cost a third of a request)."""
        if not self.write_due:
            self.write_due = True
            self.loop.call_soon(self._write_due)

    def _write_due(self) -> None:
        if self.write_due:
            self.flush()

    def close(self) -> None:
        """A lingering close: what is queued (a GOAWAY, the last responses) goes out, the write side
        shuts, and the client's last bytes are read and dropped until it closes (or LINGER passes):
        closing with unread bytes in the socket would reset the connection, and the client could
        lose the responses it has not read yet."""
        if not self.closing:
            self.flush()
            self.closing = True
            self.linger_since = self.loop.time()
            if self.read_paused or self.memory_paused:
                self.transport.resume_reading()
            if self.transport.can_write_eof():
                self.transport.write_eof()
            elif self.refused:
                close_refused(self.transport, self.loop)
            else:  # TLS: close() sends close_notify and reads on until the client's (or a timeout)
                self.transport.close()

    def stop(self) -> None:
        """Graceful stop: the two-step GOAWAY (Http2Connection.goaway); the streams taken until the
        final one finish, then the connection closes."""
        if self.closing or self.goaway_sent:
            return
        self.goaway_sent = True
        self.h2.goaway()
        self.flush()  # (it closes after the final GOAWAY: data_received on the PING's ACK, or sweep)

    def sweep(self, now: float, timeouts: Timeouts, drain_until: float) -> None:
        """The connection contract's deadlines (once a second, from Server.tick)."""
        if timeouts.write_stalled(self.write_blocked_since, now):
            log_write_timeout(timeouts.write, self.client_addr, None)
            self.transport.abort()
            return
        if self.closing:
            if now - self.linger_since >= LINGER:
                self.transport.close()
            return
        if self.goaway_sent:
            self.h2.tick()  # (the final GOAWAY, if the PING's ACK is overdue)
            self.flush()
            if self.h2.ended or (self.h2.going_away and not self.streams):
                self.close()  # (ended: a client that never sent its preface, at the drain's wait)
                return
        if self.streams:
            for stream in list(self.streams.values()):
                self.sweep_stream(stream, now, timeouts)
            return  # (the apps' time is the worker's --timeout)
        phase = Phase.HEAD if self.fresh else Phase.IDLE
        if timeouts.expiry(phase, self.since, now, drain_until, 0, False) is not Expiry.NONE:
            self.stop()

    def sweep_stream(self, stream: Stream, now: float, timeouts: Timeouts) -> None:
        """A stream's own deadlines: its body (408, or a reset once the response started) and a
        client window that stays shut (the write timeout: reset). Only that stream pays."""
        if stream.gone or stream.complete:
            return
        if not stream.body_done:
            if end_if_body_overdue(self.h2, stream, now, timeouts):
                self.flush()
                stream.reset()
        elif stream.window_wait_since and now - stream.window_wait_since > timeouts.write:
            log_write_timeout(timeouts.write, self.client_addr, stream.request, "stream reset")
            self.h2.reset(stream.sid, ErrorCodes.CANCEL)
            self.flush()
            stream.reset()
