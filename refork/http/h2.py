"""HTTP/2 server connections, sans-IO: bytes in, events out, on top of the ``h2`` library.

:class:`Http2Connection` wraps ``h2.connection.H2Connection`` with refork's limits and attack
budgets and turns its events into a few of refork's own (:class:`StreamOpened` carries the same
:class:`refork.http.events.Request` the HTTP/1.1 parser makes). No sockets, no clock of its own
(``clock`` is injected), no threads: the loop that owns the socket feeds bytes in with
:meth:`Http2Connection.receive`, writes what :meth:`Http2Connection.data_to_send` returns and
sends responses through :meth:`respond` / :meth:`send_body`.

What each known attack gets (docs/http2.md):

- Rapid Reset (streams opened and reset at once) and MadeYouReset (stream errors that make the
  server reset them): one budget of resets per connection, then GOAWAY ENHANCE_YOUR_CALM.
- CONTINUATION flood: a header block is bounded while it arrives (its encoded bytes may not pass
  the max header list size); HPACK bomb: the decoded list is bounded while it is decoded (hpack's
  check); both end the connection (GOAWAY).
- SETTINGS, PING, WINDOW_UPDATE, PRIORITY and empty DATA floods: a token budget each, then GOAWAY
  ENHANCE_YOUR_CALM.
- A stream opened past SETTINGS_MAX_CONCURRENT_STREAMS: RST_STREAM REFUSED_STREAM (the client may
  send it again), from the resets budget.
- A frame announcing a payload over SETTINGS_MAX_FRAME_SIZE is refused from its 9-byte header,
  before its payload is buffered.

Those end the connection with one GOAWAY at once; a graceful end (:meth:`Http2Connection.goaway`)
takes two, a round trip apart, so the streams already on the wire are served.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings
from h2.errors import ErrorCodes
from h2.stream import StreamClosedBy
from hyperframe.exceptions import InvalidPaddingError
from hyperframe.frame import ContinuationFrame, Frame, GoAwayFrame, HeadersFrame, RstStreamFrame

from refork.http.events import Request

__all__ = [
    "ANY_STREAM", "GOAWAY_WAIT", "PREFACE", "Budget", "ConnectionEnded", "ErrorCodes", "Http2Connection",
    "Http2Limits", "StreamBody", "StreamEnded", "StreamOpened", "StreamReset", "WindowOpened",
]  # fmt: skip

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ANY_STREAM = (1 << 31) - 1  # the first GOAWAY's last stream id: every stream on the wire is still taken
# seconds the final GOAWAY waits for the ACK of the PING sent with the first, at most; under the
# loops' one-second sweep, so that the sweep after the first GOAWAY's sends it despite its jitter
GOAWAY_WAIT = 0.9
_GOAWAY_PING = b"goaway\x00\x00"  # that PING's opaque data
_BLOCK_FRAMES = (HeadersFrame.type, ContinuationFrame.type)  # the frames a header block is made of


@dataclass(frozen=True)
class Http2Limits:
    """What one connection may do; from the settings (refork.config: http2_* and the HTTP limits)."""

    max_concurrent_streams: int = 100
    initial_window_size: int = 65535
    max_frame_size: int = 16384
    max_header_list_size: int = 65536
    max_request_line: int = 8190  # the :path (414 on its stream above it)
    max_fields: int = 100  # header count (431)
    max_field_size: int = 8190  # one header's name and value (431)
    max_body: int = 0  # request body bytes per stream (413 above; 0: unlimited)
    # attack budgets: (burst, refilled per second), per connection
    resets: tuple[int, float] = (200, 20.0)
    settings: tuple[int, float] = (50, 5.0)
    pings: tuple[int, float] = (50, 5.0)
    window_updates: tuple[int, float] = (5000, 1000.0)
    priorities: tuple[int, float] = (1000, 100.0)
    empty_data: tuple[int, float] = (200, 20.0)
    connection_window: int = 1 << 24  # the receive window of the whole connection


class Budget:
    """A token bucket: ``burst`` spends at once, refilled at ``rate`` per second of ``clock``."""

    __slots__ = ("burst", "rate", "tokens", "stamp", "clock")

    def __init__(self, burst: int, rate: float, clock: Callable[[], float]) -> None:
        self.burst, self.rate, self.clock = burst, rate, clock
        self.tokens = float(burst)
        self.stamp = clock()

    def spend(self, n: int = 1) -> bool:
        """Take ``n`` tokens; False when the bucket is empty (the peer is over its budget)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens -= n
        return self.tokens >= 0


# Events ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamOpened:
    """A request head on a new stream. ``refused`` is a status to answer at once without the app
    (413, 414, 431, 400); ``ended``: no body follows."""

    stream_id: int
    request: Request
    ended: bool
    refused: int = 0


@dataclass(slots=True)
class StreamBody:
    """Request body bytes; the stream's window reopens by :meth:`Http2Connection.body_consumed`."""

    stream_id: int
    data: bytes


@dataclass(slots=True)
class StreamEnded:
    """The request body is complete (END_STREAM)."""

    stream_id: int


@dataclass(slots=True)
class StreamReset:
    """The client reset the stream (RST_STREAM), or refork did on a limit (``by_client`` False)."""

    stream_id: int
    code: int
    by_client: bool = True


@dataclass(slots=True)
class WindowOpened:
    """The client opened a send window: bodies waiting on flow control may go on."""

    stream_id: int  # 0: the connection's window (every stream)


@dataclass(slots=True)
class ConnectionEnded:
    """The connection is over: a GOAWAY went out (``reason``) or came in (``by_client``)."""

    code: int
    reason: str
    by_client: bool = False
    last_stream_id: int = 0


Http2Event = StreamOpened | StreamBody | StreamEnded | StreamReset | WindowOpened | ConnectionEnded


class _TooMuch(h2.exceptions.DenialOfServiceError):
    """A budget or a size bound was exceeded: GOAWAY ENHANCE_YOUR_CALM."""


class _BoundedFrameBuffer(h2.frame_buffer.FrameBuffer):
    """h2's frame buffer, refusing an oversized frame from its header and a header block (HEADERS
    and its CONTINUATIONs) whose encoded bytes pass the max header list size while it arrives."""

    def __init__(self, max_block: int) -> None:
        super().__init__(server=True)
        self.max_block = max_block
        self.block = 0

    def __next__(self) -> Frame:
        data = self._data
        if len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if length > self.max_frame_size:
                raise h2.exceptions.FrameTooLargeError(f"frame of {length} bytes announced")
        return super().__next__()

    def _update_header_buffer(self, f: Frame | None) -> Frame | None:
        if isinstance(f, (HeadersFrame, ContinuationFrame)):
            self.block = len(f.data) + (self.block if self._headers_buffer else 0)
            if self.block > self.max_block:
                self._headers_buffer = []
                raise _TooMuch(f"a header block of more than {self.max_block} bytes")
        return super()._update_header_buffer(f)


class Http2Connection:
    """One server-side HTTP/2 connection: the h2 state machine under refork's limits and budgets."""

    def __init__(
        self, limits: Http2Limits, clock: Callable[[], float] = time.monotonic,
        tally: Callable[[str], None] = lambda what: None,
    ) -> None:  # fmt: skip
        self.limits = limits
        self.tally = tally  # counts "streams", "resets_received", "resets_sent", "goaways_sent"
        config = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_inbound_headers=True,
            normalize_inbound_headers=True, validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )  # fmt: skip
        conn = self.h2 = h2.connection.H2Connection(config)
        s = h2.settings.SettingCodes
        conn.local_settings = h2.settings.Settings(client=False, initial_values={
            s.MAX_CONCURRENT_STREAMS: limits.max_concurrent_streams,
            s.INITIAL_WINDOW_SIZE: limits.initial_window_size,
            s.MAX_FRAME_SIZE: limits.max_frame_size,
            s.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
            s.ENABLE_PUSH: 0,
        })  # fmt: skip
        conn.max_inbound_frame_size = limits.max_frame_size
        conn.decoder.max_header_list_size = limits.max_header_list_size
        conn.incoming_buffer = _BoundedFrameBuffer(limits.max_header_list_size)
        self.budgets = {
            name: Budget(getattr(limits, name)[0], getattr(limits, name)[1], clock)
            for name in ("resets", "settings", "pings", "window_updates", "priorities", "empty_data")
        }
        self.received: dict[int, int] = {}  # stream -> body bytes so far (the body limit)
        self.last_stream_id = 0  # the highest stream handed on (the final GOAWAY names it)
        self.ended = False
        self.clock = clock
        self.draining_since: float | None = None  # the first graceful GOAWAY went out (clock time)
        self.going_away = False  # the final graceful GOAWAY went out: no new streams

    def start(self) -> None:
        """The server's preface (SETTINGS), and the connection's receive window opened wide."""
        self.h2.initiate_connection()
        grow = self.limits.connection_window - 65535
        if grow > 0:
            self.h2.increment_flow_control_window(grow)

    # Bytes in ----------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Http2Event]:
        """Feed bytes from the client; the events they make. After a :class:`ConnectionEnded` the
        connection takes nothing more (write out :meth:`data_to_send`, then close)."""
        if self.ended:
            return []
        conn = self.h2
        out: list[Http2Event] = []
        # h2's receive_data(), frame by frame: the events of the frames before a bad one are kept,
        # and a budget spent stops the reading at the frame that spent it
        buffer = conn.incoming_buffer
        try:
            buffer.add_data(data)
            buffer.max_frame_size = conn.max_inbound_frame_size
            for frame in buffer:
                if type(frame) is HeadersFrame and self._over_the_limit(frame):
                    continue
                for event in conn._receive_frame(frame):
                    self._translate(event, out)
                if self.ended:
                    break
        except _TooMuch as e:
            out.append(self._end(ErrorCodes.ENHANCE_YOUR_CALM, str(e)))
        except InvalidPaddingError as e:
            out.append(self._end(ErrorCodes.PROTOCOL_ERROR, f"invalid padding: {e}"))
        except h2.exceptions.ProtocolError as e:
            code = getattr(e, "error_code", None) or ErrorCodes.PROTOCOL_ERROR
            out.append(self._end(code, str(e) or type(e).__name__))
        return out

    def _over_the_limit(self, frame: HeadersFrame) -> bool:
        """A new stream past SETTINGS_MAX_CONCURRENT_STREAMS: RST_STREAM REFUSED_STREAM (RFC 9113
        5.1.2 makes it a stream error; h2 would end the connection, and the client's other streams
        with it). Its header block is still decoded, so HPACK's table stays the client's; the
        refusals come out of the resets budget, so opening streams in a loop ends in a GOAWAY."""
        conn = self.h2
        sid = frame.stream_id
        if sid in conn.streams or sid <= conn.highest_inbound_stream_id or sid % 2 == 0:
            return False  # (not a new client stream: h2 judges it)
        if conn.open_inbound_streams < conn.local_settings.max_concurrent_streams:
            return False
        h2.connection._decode_headers(conn.decoder, frame.data)  # (h2's own errors if it does not decode)
        conn.highest_inbound_stream_id = sid
        conn._closed_streams[sid] = StreamClosedBy.SEND_RST_STREAM  # its DATA in flight: dropped
        refusal = RstStreamFrame(sid)
        refusal.error_code = ErrorCodes.REFUSED_STREAM
        conn._prepare_for_sending([refusal])
        self.tally("resets_sent")
        if not self.budgets["resets"].spend():
            raise _TooMuch("too many streams past the concurrency limit")
        return True

    def _translate(self, event: h2.events.Event, out: list[Http2Event]) -> None:
        budgets = self.budgets
        kind = type(event)
        if kind is h2.events.RequestReceived:
            assert isinstance(event, h2.events.RequestReceived)
            self.tally("streams")
            self._opened(event, out)
        elif kind is h2.events.DataReceived:
            assert isinstance(event, h2.events.DataReceived)
            self._data(event, out)
        elif kind is h2.events.StreamEnded:
            assert isinstance(event, h2.events.StreamEnded)
            if event.stream_id in self.received:
                out.append(StreamEnded(event.stream_id))
        elif kind is h2.events.StreamReset:
            assert isinstance(event, h2.events.StreamReset)
            sid = event.stream_id
            if self.received.pop(sid, None) is not None:
                out.append(StreamReset(sid, int(event.error_code or 0), event.remote_reset))
            self.tally("resets_received" if event.remote_reset else "resets_sent")
            # the client's resets (Rapid Reset) and those its stream errors make refork send
            # (MadeYouReset: DATA on a closed stream, a window overflow...) share one budget
            if not budgets["resets"].spend():
                what = "Rapid Reset" if event.remote_reset else "stream errors, MadeYouReset"
                raise _TooMuch(f"too many streams reset ({what})")
        elif kind is h2.events.WindowUpdated:
            assert isinstance(event, h2.events.WindowUpdated)
            if not budgets["window_updates"].spend():
                raise _TooMuch("too many WINDOW_UPDATE frames")
            out.append(WindowOpened(event.stream_id or 0))
        elif kind is h2.events.RemoteSettingsChanged:
            if not budgets["settings"].spend():
                raise _TooMuch("too many SETTINGS frames")
            out.append(WindowOpened(0))  # a new initial window may have opened every stream's
        elif kind is h2.events.PingReceived:
            if not budgets["pings"].spend():
                raise _TooMuch("too many PING frames")
        elif kind is h2.events.PingAckReceived:
            assert isinstance(event, h2.events.PingAckReceived)
            if event.ping_data == _GOAWAY_PING and self.draining_since is not None:
                self._final_goaway()  # the client has read the first GOAWAY: what it sent before is here
        elif kind is h2.events.PriorityUpdated:
            if not budgets["priorities"].spend():
                raise _TooMuch("too many PRIORITY frames")
        elif kind is h2.events.ConnectionTerminated:
            assert isinstance(event, h2.events.ConnectionTerminated)
            self.ended = True
            out.append(ConnectionEnded(int(event.error_code or 0), "GOAWAY from the client", True,
                                       event.last_stream_id or 0))  # fmt: skip

    def _opened(self, event: h2.events.RequestReceived, out: list[Http2Event]) -> None:
        sid = event.stream_id
        ended = event.stream_ended is not None
        if self.going_away:  # (h2 has no state for "GOAWAY sent, gracefully": refuse it here)
            self._reset(sid, ErrorCodes.REFUSED_STREAM)
            return
        self.last_stream_id = sid
        request, refused = self._request(event.headers or [])
        length, most = request.content_length, self.limits.max_body
        if not refused and length is not None and most and length > most:
            refused = 413
        if not refused:  # (a refused stream's body is dropped as it comes)
            self.received[sid] = 0
        out.append(StreamOpened(sid, request, ended, refused))  # (h2's StreamEnded follows if ended)

    def _request(self, headers: Iterable[Any]) -> tuple[Request, int]:
        limits = self.limits
        method, path, authority, scheme = "GET", b"/", b"", b""
        fields: list[tuple[bytes, bytes]] = []
        refused = 0
        length: int | None = None
        for name, value in headers:
            name, value = bytes(name), bytes(value)
            if name[:1] == b":":
                if name == b":method":
                    method = value.decode("latin-1")
                elif name == b":path":
                    path = value
                elif name == b":authority":
                    authority = value
                elif name == b":scheme":
                    scheme = value
                continue
            if len(name) + len(value) > limits.max_field_size:
                refused = refused or 431
            if name == b"content-length":
                length = int(value) if value.isdigit() else None
            fields.append((name, value))
        if authority and not any(n == b"host" for n, _ in fields):
            fields.insert(0, (b"host", authority))
        if len(fields) > limits.max_fields:
            refused = refused or 431
        if len(path) > limits.max_request_line:
            refused = 414
        raw_path, _, query = path.partition(b"?")
        del scheme  # the connection's (TLS or not) is the scope's scheme, as for HTTP/1.1
        request = Request(method, path, raw_path, query, "2.0", fields, True, False, False, length)
        return request, refused

    def _data(self, event: h2.events.DataReceived, out: list[Http2Event]) -> None:
        sid = event.stream_id
        size = event.flow_controlled_length or 0
        if size:
            self.h2.increment_flow_control_window(size)  # the connection's: each stream bounds itself
        elif not event.stream_ended and not self.budgets["empty_data"].spend():
            raise _TooMuch("too many empty DATA frames")
        data = event.data or b""
        got = self.received.get(sid)
        if got is None:
            return  # a stream already answered and closed by refork: dropped
        got += len(data)
        self.received[sid] = got
        if self.limits.max_body and got > self.limits.max_body:
            self.received.pop(sid, None)
            self._reset(sid, ErrorCodes.CANCEL)
            out.append(StreamReset(sid, ErrorCodes.CANCEL, by_client=False))
            return
        if size > len(data):  # padding: not the app's to consume
            self.body_consumed(sid, size - len(data))
        if data:
            out.append(StreamBody(sid, data))

    # Bytes out ---------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        return self.h2.data_to_send()

    def respond(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]],
                end_stream: bool) -> None:  # fmt: skip
        """The response head (``headers`` as the app gave them; connection-specific ones dropped)."""
        block = [(b":status", str(status).encode())]
        block += [(n.lower(), v) for n, v in headers if n.lower() not in _CONNECTION_HEADERS]
        try:
            self.h2.send_headers(stream_id, block, end_stream=end_stream)
        except h2.exceptions.StreamClosedError:
            pass  # reset by the client meanwhile (its StreamReset event says so)
        if end_stream:
            self.received.pop(stream_id, None)

    def informational(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """A 1xx response (103 Early Hints) before the final one: a HEADERS frame that does not end
        the stream."""
        block = [(b":status", str(status).encode())]
        try:
            self.h2.send_headers(stream_id, block + [(n.lower(), v) for n, v in headers], end_stream=False)
        except h2.exceptions.StreamClosedError:
            pass  # reset by the client meanwhile (its StreamReset event says so)

    def window(self, stream_id: int) -> int:
        """Body bytes the stream may send now (the smaller of its and the connection's windows)."""
        try:
            return self.h2.local_flow_control_window(stream_id)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
            return 0

    def send_body(self, stream_id: int, data: memoryview, end_stream: bool) -> int:
        """Send as much of ``data`` as flow control allows now, in frames of the client's maximum
        size; the bytes sent (END_STREAM goes with the last byte only)."""
        conn = self.h2
        size = conn.max_outbound_frame_size
        sent = 0
        total = len(data)
        while sent < total:
            n = min(self.window(stream_id), size, total - sent)
            if n <= 0:
                return sent
            last = sent + n == total
            try:
                conn.send_data(stream_id, data[sent:sent + n].tobytes(), end_stream=end_stream and last)
            except h2.exceptions.StreamClosedError:
                return total  # reset by the client meanwhile: nothing more goes out on it
            sent += n
        if not total and end_stream:
            try:
                conn.send_data(stream_id, b"", end_stream=True)
            except h2.exceptions.StreamClosedError:
                pass
        if end_stream:
            self.received.pop(stream_id, None)
        return sent

    def send_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        try:
            self.h2.send_headers(stream_id, [(n.lower(), v) for n, v in headers], end_stream=True)
        except h2.exceptions.StreamClosedError:
            pass
        self.received.pop(stream_id, None)

    def body_consumed(self, stream_id: int, n: int) -> None:
        """The app took ``n`` body bytes: the client may send that many more on the stream."""
        if n <= 0 or self.ended:
            return
        try:
            self.h2.increment_flow_control_window(n, stream_id=stream_id)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
            pass  # the stream ended meanwhile

    def reset(self, stream_id: int, code: int = ErrorCodes.INTERNAL_ERROR) -> None:
        """Abandon a stream (a response the app could not finish, a body over its limit)."""
        self.received.pop(stream_id, None)
        self._reset(stream_id, code)

    def _reset(self, stream_id: int, code: int) -> None:
        try:
            self.h2.reset_stream(stream_id, ErrorCodes(code))
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
            return
        self.tally("resets_sent")

    def goaway(self) -> None:
        """Graceful, in two steps (RFC 9113 6.8), so no stream on the wire is lost: a GOAWAY NO_ERROR
        naming ANY_STREAM and a PING now; the final GOAWAY, naming the last stream handed on, once
        the PING's ACK comes (:meth:`receive`) or GOAWAY_WAIT has passed (:meth:`tick`). Streams
        the client opens between the two are served; those after the final one are refused."""
        if self.draining_since is None and not self.ended:
            self.draining_since = self.clock()
            self._send_goaway(ANY_STREAM)
            self.h2.ping(_GOAWAY_PING)  # (h2 is open: a GOAWAY from the client or an error ends it)

    def tick(self) -> None:
        """The final GOAWAY, if GOAWAY_WAIT has passed since the first without the PING's ACK."""
        since = self.draining_since
        if since is not None and not self.going_away and self.clock() - since >= GOAWAY_WAIT:
            self._final_goaway()

    def _final_goaway(self) -> None:
        if not self.going_away and not self.ended:
            self.going_away = True
            self._send_goaway(self.last_stream_id)

    def _send_goaway(self, last_stream_id: int) -> None:
        # not h2's close_connection(): its state machine sends nothing more after a GOAWAY, and
        # the streams named in this one are still to be answered
        frame = GoAwayFrame(0)
        frame.last_stream_id = last_stream_id
        frame.error_code = ErrorCodes.NO_ERROR
        self.h2._prepare_for_sending([frame])
        self.tally("goaways_sent")

    def _end(self, code: int, reason: str) -> ConnectionEnded:
        """GOAWAY with ``code``: nothing more is read."""
        self.ended = True
        self.h2.incoming_buffer = _BoundedFrameBuffer(self.limits.max_header_list_size)  # never read now
        try:
            self.h2._terminate_connection(ErrorCodes(code))
            self.tally("goaways_sent")
        except h2.exceptions.ProtocolError:
            pass  # (h2 closed already)
        return ConnectionEnded(code, reason, last_stream_id=self.last_stream_id)

    @property
    def buffered(self) -> int:
        """Bytes received and held, not handed on yet: a header block not ended (its HEADERS and
        CONTINUATIONs) and the frame being received."""
        buffer = self.h2.incoming_buffer
        assert isinstance(buffer, _BoundedFrameBuffer)
        return (buffer.block if buffer._headers_buffer else 0) + len(buffer._data)

    @property
    def head_arriving(self) -> bool:
        """A header block has begun and not ended: its CONTINUATIONs are awaited, or its first
        frame is arriving (however the client's bytes were cut, they are a head's)."""
        buffer = self.h2.incoming_buffer
        data = buffer._data
        return bool(buffer._headers_buffer) or (len(data) >= 9 and data[3] in _BLOCK_FRAMES)

    def overloaded(self, reason: str) -> ConnectionEnded:
        """No room for what the client sends (the worker's budget): GOAWAY ENHANCE_YOUR_CALM."""
        return self._end(ErrorCodes.ENHANCE_YOUR_CALM, reason)

    def release(self) -> None:
        """The connection is gone: break h2's reference cycle (its frame dispatch table holds its own
        bound methods) so it is freed now, not at the next full collection; what it buffered (a header
        block arriving) goes now even if its owner is kept a while (in a cycle of its own)."""
        self.h2._frame_dispatch_table.clear()
        buffer = self.h2.incoming_buffer
        buffer._data = bytearray()
        buffer._headers_buffer = []

    @property
    def open_streams(self) -> int:
        return len(self.received)


_CONNECTION_HEADERS = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)
