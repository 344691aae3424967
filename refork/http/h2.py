"""HTTP/2 server connections, sans-IO: bytes in, events out, on the ``h2`` crate (Rust).

:class:`Http2Connection` holds a native ``refork._native.Http2Core`` (native/src/h2/: the crate's
``server::Connection`` driven by hand over an in-memory transport, refork's frame-header prefilter
and budgets) and turns its events into a few of refork's own (:class:`StreamOpened` carries the
same :class:`refork.http.events.Request` the HTTP/1.1 parser makes). No sockets, no clock of its
own (``clock`` is injected), no threads: the loop that owns the socket feeds bytes in with
:meth:`Http2Connection.receive`, writes what :meth:`Http2Connection.data_to_send` returns and
sends responses through :meth:`respond` / :meth:`send_body`.

What each known attack gets (docs/http2.md):

- Rapid Reset (streams opened and reset at once) and MadeYouReset (stream errors that make the
  server reset them): one budget of resets per connection, then GOAWAY ENHANCE_YOUR_CALM.
- CONTINUATION flood: a header block is bounded while it arrives (its encoded bytes may not pass
  the max header list size); HPACK bomb: the decoded list is bounded while it is decoded (the
  crate's check); both end the connection (GOAWAY).
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

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from refork._native import Http2Core
from refork.http.events import Request

__all__ = [
    "ANY_STREAM", "GOAWAY_WAIT", "PREFACE", "ConnectionEnded", "ErrorCodes", "Http2Connection",
    "Http2Limits", "StreamBody", "StreamEnded", "StreamOpened", "StreamReset", "WindowOpened",
]  # fmt: skip

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ANY_STREAM = (1 << 31) - 1  # the first GOAWAY's last stream id: every stream on the wire is still taken
# seconds the final GOAWAY waits for the ACK of the PING sent with the first, at most; under the
# loops' one-second sweep, so that the sweep after the first GOAWAY's sends it despite its jitter
GOAWAY_WAIT = 0.9
_TALLIES = ("streams", "resets_received", "resets_sent", "goaways_sent")


class ErrorCodes(enum.IntEnum):
    """HTTP/2 error codes (RFC 9113 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


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


class Http2Connection:
    """One server-side HTTP/2 connection: the crate's state machine under refork's limits and budgets."""

    def __init__(
        self, limits: Http2Limits, clock: Callable[[], float] = time.monotonic,
        tally: Callable[[str], None] = lambda what: None,
    ) -> None:  # fmt: skip
        self.limits = limits
        self.tally = tally  # counts "streams", "resets_received", "resets_sent", "goaways_sent"
        self.clock = clock
        budgets = [getattr(limits, name) for name in (
            "resets", "settings", "pings", "window_updates", "priorities", "empty_data")]  # fmt: skip
        self.core = Http2Core(
            limits.max_concurrent_streams, limits.initial_window_size, limits.max_frame_size,
            limits.max_header_list_size, limits.connection_window, [(int(b), float(r)) for b, r in budgets],
        )  # fmt: skip
        self.received: dict[int, int] = {}  # stream -> body bytes so far (the body limit)

    @property
    def ended(self) -> bool:
        return self.core.ended

    @property
    def going_away(self) -> bool:
        """The final graceful GOAWAY went out: no new streams."""
        return self.core.going_away

    @property
    def last_stream_id(self) -> int:
        """The highest stream handed on (the final GOAWAY names it)."""
        return self.core.last_stream_id

    def start(self) -> None:
        """The server's preface (SETTINGS), and the connection's receive window opened wide."""
        self.core.start()

    # Bytes in ----------------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Http2Event]:
        """Feed bytes from the client; the events they make. After a :class:`ConnectionEnded` the
        connection takes nothing more (write out :meth:`data_to_send`, then close)."""
        out: list[Http2Event] = []
        for event in self.core.receive(data, self.clock()):
            self._translate(event, out)
        self._tally()
        return out

    def _tally(self) -> None:
        counts = self.core.take_tallies()
        if any(counts):
            for name, n in zip(_TALLIES, counts, strict=True):
                for _ in range(n):
                    self.tally(name)

    def _translate(self, event: tuple[Any, ...], out: list[Http2Event]) -> None:
        kind = event[0]
        if kind == 1:  # body
            sid, data = event[1], event[2]
            got = self.received.get(sid)
            if got is None:
                return  # a stream already answered or refused by refork: dropped
            got += len(data)
            self.received[sid] = got
            if self.limits.max_body and got > self.limits.max_body:
                self.received.pop(sid, None)
                self.core.reset(sid, ErrorCodes.CANCEL)
                out.append(StreamReset(sid, ErrorCodes.CANCEL, by_client=False))
                return
            out.append(StreamBody(sid, data))
        elif kind == 0:  # a request head
            _, sid, method, path, authority, fields, ended = event
            request, refused = self._request(method, path, authority, fields)
            length, most = request.content_length, self.limits.max_body
            if not refused and length is not None and most and length > most:
                refused = 413
            if not refused:  # (a refused stream's body is dropped as it comes)
                self.received[sid] = 0
            out.append(StreamOpened(sid, request, ended, refused))
        elif kind == 2:
            if event[1] in self.received:
                out.append(StreamEnded(event[1]))
        elif kind == 3:
            _, sid, code, by_client = event
            if self.received.pop(sid, None) is not None:
                out.append(StreamReset(sid, code, by_client))
        elif kind == 4:
            out.append(WindowOpened(event[1]))
        else:
            _, code, reason, by_client, last = event
            out.append(ConnectionEnded(code, reason, by_client, last))

    def _request(
        self, method: str, path: bytes, authority: bytes, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[Request, int]:
        limits = self.limits
        fields: list[tuple[bytes, bytes]] = []
        refused = 0
        length: int | None = None
        for name, value in headers:
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
        request = Request(method, path, raw_path, query, "2.0", fields, True, False, False, length)
        return request, refused

    # Bytes out ---------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        data = self.core.data_to_send()
        self._tally()
        return data

    def respond(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]],
                end_stream: bool) -> None:  # fmt: skip
        """The response head (``headers`` as the app gave them; connection-specific ones dropped)."""
        self.core.respond(stream_id, status, headers, end_stream)
        if end_stream:
            self.received.pop(stream_id, None)

    def informational(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """A 1xx response (103 Early Hints) before the final one: a HEADERS frame that does not end
        the stream."""
        self.core.informational(stream_id, status, headers)

    def window(self, stream_id: int) -> int:
        """Body bytes the stream may send now (what flow control has given it)."""
        return self.core.window(stream_id)

    def send_body(self, stream_id: int, data: memoryview, end_stream: bool) -> int:
        """Send as much of ``data`` as flow control allows now (the crate frames it at the client's
        maximum frame size); the bytes sent (END_STREAM goes with the last byte only)."""
        sent = self.core.send_body(stream_id, data, end_stream)
        if end_stream and sent == len(data):
            self.received.pop(stream_id, None)
        return sent

    def send_trailers(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.core.send_trailers(stream_id, headers)
        self.received.pop(stream_id, None)

    def body_consumed(self, stream_id: int, n: int) -> None:
        """The app took ``n`` body bytes: the client may send that many more on the stream."""
        if n > 0 and not self.core.ended:
            self.core.body_consumed(stream_id, n)

    def reset(self, stream_id: int, code: int = ErrorCodes.INTERNAL_ERROR) -> None:
        """Abandon a stream (a response the app could not finish, a body over its limit)."""
        self.received.pop(stream_id, None)
        self.core.reset(stream_id, code)

    def goaway(self) -> None:
        """Graceful, in two steps (RFC 9113 6.8), so no stream on the wire is lost: a GOAWAY NO_ERROR
        naming ANY_STREAM and a PING now; the final GOAWAY, naming the last stream handed on, once
        the PING's ACK comes (:meth:`receive`) or GOAWAY_WAIT has passed (:meth:`tick`). Streams
        the client opens between the two are served; those after the final one are refused."""
        self.core.goaway(self.clock())

    def tick(self) -> None:
        """The final GOAWAY, if GOAWAY_WAIT has passed since the first without the PING's ACK."""
        self.core.tick(self.clock(), GOAWAY_WAIT)

    @property
    def buffered(self) -> int:
        """Bytes received and held, not handed on yet: a header block not ended (its HEADERS and
        CONTINUATIONs) and the frame being received."""
        return self.core.buffered

    @property
    def head_arriving(self) -> bool:
        """A header block has begun and not ended: its CONTINUATIONs are awaited, or its first
        frame is arriving (however the client's bytes were cut, they are a head's)."""
        return self.core.head_arriving

    def overloaded(self, reason: str) -> ConnectionEnded:
        """No room for what the client sends (the worker's budget): GOAWAY ENHANCE_YOUR_CALM."""
        events = self.core.end(ErrorCodes.ENHANCE_YOUR_CALM, reason)
        self._tally()
        for event in events:
            if event[0] == 5:
                return ConnectionEnded(event[1], event[2], event[3], event[4])
        return ConnectionEnded(ErrorCodes.ENHANCE_YOUR_CALM, reason, last_stream_id=self.last_stream_id)

    def release(self) -> None:
        """The connection is gone: what it holds (streams, buffers) goes now, even if its owner is
        kept a while (in a cycle of its own)."""
        self.core.release()

    @property
    def open_streams(self) -> int:
        return len(self.received)
