"""The request parser's rare paths: what llhttp refuses or misreads and refork gets right, found by
replaying bytes (see refork.http.llhttp) and re-fed to a fresh llhttp.

- Any token as a method (RFC 9110 9.1): llhttp knows a fixed list; an unknown token is fed to a
  fresh llhttp as _PLACEHOLDER and put back on the Request (_unknown_method).
- A protocol name other than HTTP (RFC 9112 2.3): llhttp also takes RTSP/ and ICE/ and frames them
  as HTTP/1.x; refused with 400 (_check_protocol).
- Chunk extensions with BWS around ``;`` and ``=`` (RFC 9112 7.1.1): llhttp refuses them;
  refork.http.chunked reads the chunk framing from that line to the last chunk, then a fresh
  llhttp the trailer section (_chunk_error, _feed_framing).

:class:`RareRequests` is the base of refork.http.parser.RequestParser, which holds the state
(declared here for the type checker only) and the hot path; none of this runs for a plain request.
"""

from __future__ import annotations

from httptools import HttpParserError, HttpRequestParser

from refork.http.chunked import ChunkFraming
from refork.http.events import EndOfMessage, Event, ParseError, Request
from refork.http.head import TCHAR
from refork.http.llhttp import RTSP_ONLY_METHODS, may_name_other_protocol
from refork.http.llhttp import chunk_line_start as _chunk_line_start
from refork.http.llhttp import llhttp as _llhttp
from refork.http.llhttp import message_start as _message_start
from refork.http.llhttp import names_other_protocol as _names_other_protocol
from refork.http.llhttp import request_protocol as _request_protocol

EOM = EndOfMessage()  # carries no data: one shared instance saves an allocation per request

# An unknown method (any RFC 9110 token) is fed to llhttp as this one: same framing, no CONNECT
# or upgrade semantics, and put back on the Request event.
PLACEHOLDER = b"UNBIND"

# What a fresh llhttp is fed to read the trailer section of a request whose chunk framing
# refork.http.chunked read: a valid chunked head and a last chunk. Its Request is dropped.
RESUME = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"

# llhttp's error for an RTSP method (DESCRIBE, PLAY, ...) with HTTP/: to refork any token is a
# method (RFC 9110 9.1), so it is re-fed with PLACEHOLDER like a method llhttp does not know.
RTSP_METHOD_WITH_HTTP = "Invalid method for HTTP/x.x request"

# llhttp error reasons that deserve something more precise than 400.
_LLHTTP_STATUS = {
    "Invalid HTTP version": 505,
    "Pause on PRI/Upgrade": 505,
}

_EMPTY = memoryview(b"")


class RareRequests:
    """The rare paths of RequestParser (see the module docstring)."""

    # All of RequestParser's state (see its __init__); slots, so declared once, here.
    __slots__ = (
        "_p",
        "_events",
        "_max_line",
        "_max_count",
        "_max_field",
        "_max_body",
        "_max_head",
        "_url",
        "_headers",
        "_specials",
        "_ntrailers",
        "_request",
        "_keep_alive",
        "in_message",
        "_in_head",
        "_head_started",
        "_head_bytes",
        "head_held",
        "_line",
        "_past_first",
        "_ended_in_body",
        "_body_left",
        "_upgrade_body",
        "_max_chunk_line",
        "_chunk_line",
        "_method",
        "_pending",
        "_hand_off",
        "_ws_pending",
        "_upgraded",
        "_held",
        "_held_done",
        "_refed",
        "_slow",
        "_closed",
        "_error",
        "_late",
        "_data",
        "_scan",
        "_carry",
        "_rest",
        "_framing",
        "_chunks",
    )

    # The types of the state these methods use.
    _p: HttpRequestParser
    _events: list[Event]
    _max_line: int
    _max_chunk_line: int
    _url: bytes
    _request: Request | None
    _keep_alive: bool
    in_message: bool
    _in_head: bool
    _body_left: int
    _upgrade_body: int
    _chunk_line: bool
    _method: str | None
    _pending: bytes
    _held: bytearray | None
    _held_done: int
    _refed: tuple[bytes, memoryview, int] | None
    _slow: bool
    _closed: bool
    _error: ParseError | None
    _data: bytes | bytearray | memoryview
    _scan: int
    _carry: int
    _rest: tuple[memoryview, bytes, int] | None
    _framing: ChunkFraming | None
    _chunks: int

    def _set_slow(self) -> None:
        self._slow = (
            self._error is not None
            or self._closed
            or bool(self._upgrade_body or self._pending)
            or self._framing is not None
        )

    def _unknown_method(
        self,
        data: bytes | memoryview,
        began_inside: bool,
        exc: HttpParserError | None,
        done: int = 0,
        prefix: bytes = b"",
        extra: int = 0,
    ) -> memoryview:
        """llhttp knows a fixed list of methods; RFC 9110 9.1 allows any token.

        Find where the refused request starts in `data` (replaying the bytes before it through a
        scratch parser: llhttp does not tell offsets), then feed it on to a fresh parser with the
        method replaced by PLACEHOLDER; the rest is returned for _feed_rest to feed (a loop, not
        recursion, however many such requests are pipelined). on_headers_complete puts the real
        method back. The framing is llhttp's, unchanged. `began_inside`: the bytes began inside a
        message, so they cannot be replayed from a boundary and the request is refused (400, as
        llhttp would). `extra`: messages completed in `data` before this read (held bytes).
        """
        view = memoryview(data)
        if exc is not None:
            if began_inside or self._error is not None or self._closed:
                self._fail_from_llhttp(exc)  # raises, or (after a closing request) ignores
                return view[:0]
            completed = extra + sum(1 for e in self._events[done:] if e is EOM)
            start = _message_start(view, completed, prefix)
            if start is None:
                self._fail_from_llhttp(exc)
                return view[:0]
            while start < len(view) and view[start] in b"\r\n":  # empty lines first (RFC 9112 2.2)
                start += 1
            view = view[start:]
        head = bytes(view[:64])  # a method is short; look further only when it is not
        space = head.find(b" ")
        if space < 0 and len(view) > 64:
            head = bytes(view[: self._max_line])
            space = head.find(b" ")
        method = head[:space] if space >= 0 else head
        if method.translate(None, TCHAR) or space == 0:
            raise self._fail(400, "Invalid method encountered")
        if space < 0:
            if len(view) >= self._max_line:
                raise self._fail(414, "request line too long")
            self._pending = bytes(view)  # the method is still arriving
            self._slow = self.in_message = True
            return view[:0]
        self._p = _llhttp(self)
        self._method = method.decode("ascii")
        self._p.feed_data(PLACEHOLDER)  # a fresh parser: begins a message, cannot fail
        self._refed = (PLACEHOLDER, view[space:], len(self._events))
        return view[space:]

    def _chunk_error(
        self,
        exc: HttpParserError,
        stream: bytes | memoryview,
        kept: bool,
        extra: int,
        done: int,
        prefix: bytes,
    ) -> memoryview:
        """llhttp failed; if inside a chunk-size line, hand the body from that line's start to a
        ChunkFraming of our own (it allows the BWS llhttp refuses, see refork.http.chunked) and
        return what follows the bytes it read, else raise the error. `stream` is what llhttp was
        fed since a message boundary, after `prefix`, with `extra` messages completed in it before
        this read's events from `done`; `kept`: the bytes since the boundary are all there (else
        the line cannot be found: the error stands)."""
        request = self._request
        if (
            request is None
            or not request.chunked
            or not (self._chunk_line and self._in_head)
            or self._error is not None
            or self._closed
            or not kept
        ):
            self._fail_from_llhttp(exc)
            return _EMPTY
        completed = extra + sum(1 for e in self._events[done:] if e is EOM)
        start = _chunk_line_start(stream, completed, self._chunks + 1, prefix)
        if start is None:
            self._fail_from_llhttp(exc)
            return _EMPTY
        self._framing = ChunkFraming(self._max_chunk_line, self._body_left)
        self._held = self._refed = None  # llhttp is not fed the framed bytes: no replay through them
        self._in_head = False  # ChunkFraming bounds its lines itself: feed() is not to count them
        self._slow = True
        return self._feed_framing(memoryview(stream)[start:]) or _EMPTY

    def _feed_framing(self, data: memoryview) -> memoryview | None:
        """Feed the chunk framing; once it has read the last-chunk line, a fresh llhttp reads
        the trailer section: it is fed RESUME (a chunked head and a last chunk) as if it had
        read this request, and the rest is returned to be fed to it."""
        framing = self._framing
        assert framing is not None
        try:
            end = framing.feed(data, self._events)
        except ParseError as exc:
            raise self._failed(exc) from None
        if end is None:
            return None
        self._framing = None
        request, keep_alive = self._request, self._keep_alive
        self._request = None  # RESUME's fields are no trailers
        self._scan = 1  # nor is its protocol name to be checked
        self._p = _llhttp(self)
        self._p.feed_data(RESUME)  # cannot fail: a valid head and last chunk
        self._events.pop()  # its Request
        self._request, self._keep_alive = request, keep_alive
        self._set_slow()
        rest = data[end:]
        self._refed = (RESUME, rest, len(self._events))
        return rest

    def _fail(self, status: int, reason: str) -> ParseError:
        """Remember the error (the parser is unusable afterwards) and return it for raising."""
        self._error = err = ParseError(status, reason)
        self._slow = True
        return err

    def _failed(self, err: ParseError) -> ParseError:
        """_fail() for an error raised by a rule of refork.http.head."""
        self._error = err
        self._slow = True
        return err

    def _fail_from_llhttp(self, exc: HttpParserError) -> None:
        if self._error is not None:  # raised by one of our callbacks
            raise self._error from None
        if self._closed:  # data after a non-keep-alive request: ignored, not an error
            return
        reason = str(exc) or "bad request"
        raise self._fail(_LLHTTP_STATUS.get(reason, 400), reason) from None

    def _check_protocol(self, raw_method: bytes) -> None:
        """Refuse a request line whose protocol name is not HTTP (RFC 9112 2.3): llhttp also
        accepts RTSP/ and ICE/ and frames them as HTTP/1.x without saying which it saw.

        Called only when the bytes hold RTSP/ (looked for once per read by on_headers_complete,
        and across reads for a head that spans them), or for the SOURCE method (ICE/). Then the
        request line is found by replaying the bytes since the last message boundary
        (llhttp.request_protocol), or, when those are no longer kept (more than _MAX_HELD since,
        or an upgrade), read roughly (llhttp.names_other_protocol).
        """
        if self._carry:  # the head began in an earlier read that may name one
            self._carry = 0
            self._scan = 0  # for the later requests of this read: look at the read itself
        elif not may_name_other_protocol(self._data):  # not bytes: looked at only here
            self._scan = 1
            return
        if raw_method in RTSP_ONLY_METHODS:
            raise self._fail(400, "protocol is not HTTP")
        if raw_method not in (b"GET", b"POST", b"OPTIONS", b"SOURCE"):
            return  # llhttp takes RTSP/ and ICE/ with no other method
        # Such a request line holds ` <target> RTSP/` (or ICE/): a search for that, in what llhttp
        # was fed since the last boundary, rules most requests out before any replay.
        rest = self._rest
        if rest is not None:
            view, prefix, done = rest
            if not _names_other_protocol(view, self._url):
                return
            completed = sum(1 for e in self._events[done:] if e is EOM)
            protocol = _request_protocol(view, completed, prefix)
        elif self._held is not None:
            stream = bytes(self._held) + bytes(self._data) if self._held else bytes(self._data)
            if not _names_other_protocol(stream, self._url):
                return
            completed = self._held_done + sum(1 for e in self._events if e is EOM)
            protocol = _request_protocol(stream, completed)
        elif _names_other_protocol(self._data, self._url):
            protocol = None  # the bytes to replay are gone: the rough reading decides
        else:
            return
        if protocol is None or not protocol.startswith(b"HTTP/"):
            raise self._fail(400, "protocol is not HTTP")
