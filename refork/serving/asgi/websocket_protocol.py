"""The ASGI loop's WebSocket connections: RFC 6455 over wsproto, driven by the asyncio transport.

:class:`refork.serving.asgi.http_protocol.HttpProtocol` hands a connection over after a WebSocket
handshake request (the parser stops there and keeps the bytes after the head): the transport
gets a :class:`WebSocketProtocol`, which checks the handshake, runs the app's
:class:`refork.asgi.websocket.WebSocketSession` on a Task and is that session's channel.

Why wsproto: it is sans-IO (bytes in, events out, like refork's own HTTP parser and h11), so the
frames, masking, fragmentation, UTF-8 and close rules of RFC 6455 and permessage-deflate (RFC 7692)
are one library's, and the I/O, the deadlines and the flow control stay here, on the transport.
The handshake itself (RFC 6455 4.2) is answered from the request refork already parsed, with no
second HTTP parse (refork.http.websocket_handshake).

What each setting does (docs/websockets.md):

- ``--ws-max-size``: a message over it (after decompression; text in characters) closes with 1009.
- ``--ws-per-message-deflate``: accept permessage-deflate when the client offers it.
- ``--ws-ping-interval`` / ``--ws-ping-timeout``: a ping every interval; no pong within the
  timeout closes with 1011. Judged by the once-a-second sweep, like every deadline here.
- ``--ws-max-queue``: messages the app has not received yet; at the limit, or once they and the
  message arriving hold ``--ws-max-size`` bytes, reading pauses (TCP backpressure on the client)
  until receive() takes one.
- ``--ws-max-memory``: the bytes all of a worker's WebSockets hold for their apps (messages waiting
  for receive() and the parts of those still arriving, after decompression). At the limit every
  connection stops reading until an app takes a message; one partway through a message when no
  app has a message to take (nothing would ever make room) is closed with 1009 instead.

Memory, and permessage-deflate: what a connection holds is counted after inflation, and the bytes
not inflated yet stay deflated. wsproto inflates a frame's whole piece at once as its events are
pulled (up to ``--ws-max-size``: a few KiB of deflate can be 16 MiB), so the deflated bytes wait
here (``raw``, at most a read or two: reading pauses) and wsproto is given at most
room / INFLATE_RATIO of them at a time, room being what the budgets allow and at most
INFLATE_STEP: no step can inflate past the budgets, nor make a large transient copy.
- ``--ws-write-limit``: the transport's high-water mark; over it the app's send() waits until the
  client reads. ``--write-timeout`` still cuts a client that reads nothing.

Closing: a close frame from the peer is answered and the connection closed (the server closes TCP
first, RFC 6455 7.1.1); a close the server starts (the app's, 1009, 1011, a graceful stop's
1001/1012) waits CLOSE_TIMEOUT for the peer's close frame; a protocol error (1002, 1007) sends
its close frame and closes at once.

Accounting (see refork.process.slots.AppClock): the handshake is a request started; once accepted
it is an open WebSocket (request_upgraded: in flight, holding no deadline); it finishes, with one
access-log line (status 101 and its duration), when its socket is closed and its app returned.
In the worker, an open WebSocket moves from Server.in_flight to Server.open_websockets: the drain
on a graceful stop waits for both, but a safe point (a fork, to promote this worker to a mold)
does not wait for open WebSockets, or a worker holding a long-lived one could never be promoted.
That is safe for the same reason an idle keep-alive connection is: the app's task is suspended
between two messages, and the forked child never runs it (it keeps every task of the loop
referenced and unrun, and turns its copies of the client sockets into /dev/null: see
refork.serving.asgi.server._abandon_after_fork); the parent serves the WebSocket on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    Pong,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

from refork import deadlines
from refork.asgi.websocket import WebSocketSession, build_websocket_scope
from refork.http.events import Request
from refork.http.websocket_frames import ForWsproto, FrameSplitter, server_frame
from refork.http.websocket_handshake import accept_response, handshake_error, refusal
from refork.serving.connection import Timeouts, log_access, log_write_timeout

if TYPE_CHECKING:
    from refork.serving.asgi.roles import Host

log = logging.getLogger("refork")

CLOSE_TIMEOUT = 5.0  # seconds the peer has to answer a close frame the server sent
INFLATE_RATIO = 1032  # the most one byte of deflate inflates to (a 258-byte match in two bits)
INFLATE_STEP = 1 << 20  # the most one step of wsproto inflates (it copies a piece twice meanwhile)
READ_SIZE = 256 * 1024  # the most a connection let read may take at once (asyncio's read)
GOING_AWAY, SERVICE_RESTART = 1001, 1012  # RFC 6455 7.4.1; 1012: IANA registry
_OPEN = ConnectionState.OPEN
_REMOTE_CLOSING = ConnectionState.REMOTE_CLOSING


class WebSocketProtocol(asyncio.Protocol):
    """One WebSocket connection: the transport's protocol after the hand-over, and the channel
    of the app's :class:`WebSocketSession`."""

    __slots__ = (
        "srv", "loop", "transport", "request", "session", "conn", "token", "task", "early",
        "read_paused", "write_blocked_since", "closed", "app_done", "close_deadline", "parts", "size",
        "next_ping", "ping_sent", "started_at", "remote", "stop_code", "scope_args", "finished",
        "pings", "counted_open", "max_size", "max_queue", "frames", "raw", "raw_at", "deflate",
        "memory", "reading_on",
    )  # fmt: skip

    def __init__(
        self,
        srv: Host,
        transport: Any,
        request: Request,
        early: bytes,
        scope_args: dict[str, Any],
        read_paused: bool,
    ) -> None:
        self.srv = srv
        self.loop = srv.loop
        self.transport = transport
        self.request = request
        self.session = WebSocketSession(self, srv.loop, request)
        self.conn: Connection | None = None  # once accepted
        self.token: object = None
        self.task: asyncio.Task[None] | None = None
        self.early = bytearray(early)  # bytes received before the app accepted
        self.read_paused = read_paused
        self.write_blocked_since = 0.0
        self.closed = False  # the transport is closed (or closing): nothing more goes out
        self.app_done = False
        self.finished = False
        self.close_deadline = 0.0  # a close frame was sent: the peer's must arrive before this
        self.parts: list[Any] = []  # the pieces of the message being received
        self.size = 0  # their bytes (charged to the worker's budget, like the queued messages)
        self.next_ping = 0.0
        self.ping_sent = 0.0  # when the unanswered ping left; 0: none outstanding
        self.pings = 0
        self.started_at = srv.loop.time()
        self.remote: str | None = None
        self.stop_code = 0  # a graceful stop came before the app accepted
        self.scope_args = scope_args
        self.counted_open = False  # moved from Server.in_flight to Server.open_websockets
        self.max_size = srv.config.ws_max_size
        self.max_queue = srv.config.ws_max_queue
        self.frames: FrameSplitter | None = None  # the fast path (no extension agreed)
        self.deflate = False  # permessage-deflate agreed: received bytes wait in raw
        self.raw = bytearray()  # deflated bytes not given to wsproto yet, from raw_at
        self.raw_at = 0
        self.memory = srv.ws_memory  # the worker's --ws-max-memory
        self.reading_on = False  # a _read_on() is scheduled

    # The hand-over ---------------------------------------------------------------------------

    def start(self) -> None:
        """Check the handshake, then give it to the app (reading paused until it accepts)."""
        srv, request = self.srv, self.request
        status = handshake_error(request)
        if status:
            self.session.status = status
            self.respond(refusal(status), True)
            if srv.access_log is not None:
                log_access(srv.access_log, request, None, status, 0, 0.0)
            return
        self.pause_reading()
        scope = build_websocket_scope(request, state=srv.lifespan.state, **self.scope_args)
        client = scope["client"]
        self.remote = client[0] if client else None
        srv.in_flight += 1
        self.token = srv.control.request_started(request.method, request.path)
        serving = deadlines.current.set(self.token)
        self.task = self.loop.create_task(self._run(scope))
        deadlines.current.reset(serving)

    async def _run(self, scope: dict[str, Any]) -> None:
        try:
            await self.session.run(self.srv.app, scope)
        finally:
            self.app_done = True
            self.memory.give_back(self.session.drop_queue())  # no receive() will take them now
            self._maybe_finished()

    # The session's channel -------------------------------------------------------------------

    def accept(self, subprotocol: str | None, headers: list[tuple[bytes, bytes]]) -> None:
        srv = self.srv
        config = srv.config
        head, extensions = accept_response(
            self.request, subprotocol, headers, config.ws_per_message_deflate, config.ws_max_size
        )
        self.conn = Connection(ConnectionType.SERVER, extensions)
        if not extensions:
            self.frames = FrameSplitter(self.max_size)
        self.deflate = bool(extensions)
        if self.closed:
            return  # the client went away during the app's connect handler
        transport = self.transport
        transport.set_write_buffer_limits(high=config.ws_write_limit)
        transport.write(head)
        srv.control.request_upgraded(self.token)
        srv.in_flight -= 1  # an open WebSocket does not hold a safe point (see the module docstring)
        srv.open_websockets += 1
        self.counted_open = True
        interval = srv.config.ws_ping_interval
        self.next_ping = self.loop.time() + interval if interval else 0.0
        if self.stop_code:  # a graceful stop began while the app was deciding
            self.close_server(self.stop_code)
            return
        self.resume_reading()
        if self.early:
            early, self.early = bytes(self.early), bytearray()
            self.data_received(early)
        if srv.in_flight == 0:
            srv.idle()  # a safe point may be waiting for this

    def respond(self, data: bytes, done: bool) -> None:
        if not self.closed:
            if data:
                self.transport.write(data)
            if done:
                self.closed = True
                self.transport.close()

    def send_message(self, data: str | bytes) -> bool:
        conn = self.conn
        if self.closed or conn is None or conn.state is not _OPEN:
            return True  # nothing goes out any more: nothing to wait for either
        if self.frames is not None:
            self.transport.write(server_frame(data))
        else:
            event: Message[Any] = TextMessage(data=data) if isinstance(data, str) else BytesMessage(data=data)
            self.transport.write(conn.send(event))
        return not self.write_blocked_since

    def close(self, code: int, reason: str) -> None:
        """The app's websocket.close (or its end: 1000, 1011)."""
        conn = self.conn
        if conn is None or self.closed:
            return
        if conn.state is _REMOTE_CLOSING:  # the peer closed first: this is our answer
            self._write(conn.send(CloseConnection(code, reason)))
            self._close_transport()
        elif conn.state is _OPEN:
            self._write(conn.send(CloseConnection(code, reason)))
            self.close_deadline = self.loop.time() + CLOSE_TIMEOUT

    def message_taken(self, queued: int, size: int) -> None:
        self.memory.give_back(size)
        if self.read_paused and self.conn is not None:
            # after the app's step, not inside its receive(): the message it takes is its own to
            # drop before this connection inflates the next
            self._room_made()

    # asyncio.Protocol ------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        if conn is None:
            self.early += data  # before the accept (reading is paused: at most a read or two)
            return
        frames = self.frames
        if frames is not None and frames.enabled:  # the fast path (refork.http.websocket_frames)
            if conn.state is _OPEN:
                for item in frames.feed(data):
                    if type(item) is ForWsproto:
                        self._wsproto_received(item)
                        if conn.state is not _OPEN:  # closing: what follows is dropped (RFC 6455 1.4)
                            frames.enabled = False
                            break
                    else:
                        size = len(item)  # a text message's bytes of UTF-8:
                        if type(item) is str and not item.isascii():  # (isascii() reads a flag)
                            size = len(item.encode())
                        self.memory.charge(size)
                        self.session.message_received(item, size)
                self._flow()
                return
            frames.enabled = False  # closing: wsproto reads on, from the incomplete frame kept
            data, frames.pending = frames.pending + data, b""
        if self.deflate:
            raw = self.raw
            if self.raw_at:
                del raw[: self.raw_at]
                self.raw_at = 0
            raw += data
            self._pump()
        else:
            self._wsproto_received(data)
            self._flow()

    def _pump(self) -> None:
        """Give wsproto the deflated bytes the budgets have room for, a step at a time (see the
        module docstring); what they have no room for waits in `raw`, reading paused."""
        raw = self.raw
        memory = self.memory
        while self.raw_at < len(raw) and not self.closed:
            conn = self.conn
            assert conn is not None
            at = self.raw_at
            if conn.state is not _OPEN:  # closing: messages are dropped, nothing to bound
                n = len(raw) - at
            elif self._room():
                n = max(1, min(memory.left, INFLATE_STEP) // INFLATE_RATIO)
            else:
                break
            chunk = bytes(raw[at : at + n])
            self.raw_at = at + len(chunk)
            self._wsproto_received(chunk)
        if self.raw_at >= len(raw) or self.closed:
            raw.clear()
            self.raw_at = 0
        self._flow()

    def _room(self) -> bool:
        """Whether this connection may take in more: it holds less than --ws-max-queue messages and
        --ws-max-size bytes for its app (a message alone may reach the size), and the worker's
        total is under --ws-max-memory."""
        queue = self.session.queue
        if queue and (len(queue) >= self.max_queue or self.session.queued_bytes + self.size >= self.max_size):
            return False
        return not self.memory.full

    def _flow(self) -> None:
        """Read on while there is room; else pause (TCP backpressure) until an app takes a message,
        or close with 1009 when no app ever would (see the module docstring)."""
        if self.closed or self.conn is None:
            return
        if self._room():
            if self.raw_at >= len(self.raw):
                self.resume_reading()
            return
        self.pause_reading()
        memory = self.memory
        if not memory.full:
            return  # its own queue is full: receive() makes room (message_taken)
        if self.size and not self.session.queue and memory.used <= self.srv.ws_partial:
            log.info("WebSocket from %s: closed (1009) partway through a message: --ws-max-memory is "
                     "full and no app has a message to take", self.remote or "-")  # fmt: skip
            self._drop_partial()
            self.close_server(1009, "message too big for the server now")
            return
        memory.wait(self, self._room_made, READ_SIZE)

    def memory_full(self) -> None:
        """The worker's --ws-max-memory filled up (see Server._ws_memory_full): stop reading now,
        until there is room (each connection would read ahead once more before it heard)."""
        self._flow()

    def _room_made(self) -> None:
        """Room was made: read on soon (once, however many times it is called meanwhile)."""
        if not self.reading_on:
            self.reading_on = True
            self.loop.call_soon(self._read_on)

    def _read_on(self) -> None:
        self.reading_on = False
        if self.deflate and self.raw_at < len(self.raw):
            self._pump()
        else:
            self._flow()

    def _drop_partial(self) -> None:
        """The message being received is dropped (too big, or the connection is gone)."""
        size = self.size
        self.parts = []
        if size:
            self.size = 0
            self.srv.ws_partial -= size
            self.memory.give_back(size)

    def _wsproto_received(self, data: bytes) -> None:
        conn = self.conn
        assert conn is not None
        try:
            conn.receive_data(data)
        except LocalProtocolError:  # data after the close handshake: ignored
            return
        memory = self.memory
        for event in conn.events():
            kind = type(event)
            if kind is TextMessage or kind is BytesMessage:
                if conn.state is not _OPEN:
                    continue  # closing: data is dropped (RFC 6455 1.4)
                piece = event.data  # type: ignore[attr-defined]
                # --ws-max-size counts bytes: a text piece's UTF-8 length (isascii() is a flag read)
                ascii_only = kind is BytesMessage or piece.isascii()
                n = len(piece) if ascii_only else len(piece.encode())
                if self.size + n > self.max_size:
                    self._drop_partial()
                    self.close_server(1009, "message too big")
                    continue
                memory.charge(n)
                if not event.message_finished:  # type: ignore[attr-defined]
                    self.parts.append(piece)
                    self.size += n
                    self.srv.ws_partial += n
                    continue
                size = self.size + n
                if self.parts:
                    self.parts.append(piece)
                    piece = ("" if kind is TextMessage else b"").join(self.parts)
                    self.parts = []
                    self.srv.ws_partial -= self.size
                    self.size = 0
                self.session.message_received(piece, size)
            elif kind is Ping:
                if conn.state is _OPEN:
                    self._write(conn.send(event.response()))  # type: ignore[attr-defined]
            elif kind is Pong:
                self.ping_sent = 0.0
            elif kind is CloseConnection:
                self._close_received(event)  # type: ignore[arg-type]
                return

    def _close_received(self, event: CloseConnection) -> None:
        conn = self.conn
        assert conn is not None
        state = conn.state
        if state is _REMOTE_CLOSING:  # the peer starts the closing handshake: answer it
            self._write(conn.send(event.response()))
            self.session.disconnected(event.code, event.reason or "")
        elif state is ConnectionState.CLOSED:  # the answer to ours
            self.session.disconnected(event.code, event.reason or "")
        else:  # a protocol error wsproto found (1002, 1007, ...): fail the connection
            if state is _OPEN:
                self._write(conn.send(CloseConnection(event.code, event.reason)))
            log.debug("WebSocket protocol error from %s: %s", self.remote or "-", event.reason)
            self.session.disconnected(event.code, event.reason or "")
        self._close_transport()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        srv = self.srv
        srv.connections.discard(self)
        self.memory.cancel(self)
        self._drop_partial()
        self.raw.clear()
        self.raw_at = 0
        self.session.disconnected(1006)
        self.session.resume_sending()
        self._maybe_finished()
        if srv.stopping and not srv.connections:
            srv.check_drained()

    def pause_writing(self) -> None:
        self.write_blocked_since = self.loop.time()

    def resume_writing(self) -> None:
        self.write_blocked_since = 0.0
        self.session.resume_sending()

    def eof_received(self) -> bool | None:
        return None  # a half-closed WebSocket is over: close (connection_lost follows)

    # Closing, stopping, the sweep ------------------------------------------------------------

    def close_server(self, code: int, reason: str = "") -> None:
        """A close the server starts (1009, 1011, a graceful stop's 1001/1012): the app's
        receive() gets websocket.disconnect with this code at once."""
        conn = self.conn
        if conn is not None and conn.state is _OPEN and not self.closed:
            self._write(conn.send(CloseConnection(code, reason)))
            self.close_deadline = self.loop.time() + CLOSE_TIMEOUT
        self.session.disconnected(code, reason)
        self.session.resume_sending()

    def stop(self) -> None:
        """Graceful stop: 1001 (going away) when the whole server stops, 1012 (service restart)
        when only this worker retires (a reload; a refork or recycle once --ws-drain-timeout is
        over: see Server.begin_stop)."""
        code = GOING_AWAY if self.srv.control.server_draining else SERVICE_RESTART
        if self.conn is None:
            self.stop_code = code  # the app is deciding: closed right after its accept
        else:
            self.close_server(code, "server shutting down" if code == GOING_AWAY else "service restart")

    def sweep(self, now: float, timeouts: Timeouts, drain_until: float) -> None:
        """The connection's deadlines, once a second: writes, the close handshake, pings."""
        if timeouts.write_stalled(self.write_blocked_since, now):
            log_write_timeout(timeouts.write, self.scope_args.get("client"), self.request)
            self.transport.abort()
            return
        if self.closed:
            return
        if self.close_deadline and now >= self.close_deadline:
            self.transport.abort()  # no close frame came back in time
            return
        conn = self.conn
        if conn is None or conn.state is not _OPEN:
            return
        config = self.srv.config
        if self.ping_sent:
            timeout = config.ws_ping_timeout
            if timeout is not None and now - self.ping_sent > timeout:
                log.info("WebSocket from %s: no pong within %gs; closing (1011)", self.remote or "-", timeout)
                self.close_server(1011, "keepalive ping timeout")
                self.close_deadline = now  # the peer is not answering: cut at the next sweep
        elif self.next_ping and now >= self.next_ping:
            self.pings += 1
            self._write(conn.send(Ping(self.pings.to_bytes(4, "big"))))
            self.ping_sent = now
            self.next_ping = now + (config.ws_ping_interval or 0.0)

    def _write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def _close_transport(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def pause_reading(self) -> None:
        if not self.read_paused and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused and not self.closed:
            self.read_paused = False
            self.transport.resume_reading()

    def _maybe_finished(self) -> None:
        """Account for the WebSocket once its socket is closed and its app returned."""
        if self.finished or not (self.closed and self.app_done) or self.token is None:
            return
        if self.srv.connections and self in self.srv.connections:
            return  # closing: connection_lost comes next
        self.finished = True
        srv, session = self.srv, self.session
        if self.counted_open:
            srv.open_websockets -= 1
        else:
            srv.in_flight -= 1
        srv.control.request_finished(self.token, session.status)
        if srv.access_log is not None:
            log_access(srv.access_log, self.request, self.remote, session.status, session.sent,
                       self.loop.time() - self.started_at)  # fmt: skip
        if srv.in_flight == 0:
            srv.idle()
