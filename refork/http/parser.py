"""Sans-IO HTTP/1.1 request parser: llhttp (via httptools) plus the checks llhttp leaves to us.

Bytes go in through :meth:`RequestParser.feed`, :class:`Request` / :class:`Body` /
:class:`EndOfMessage` events come out; anything unacceptable raises :class:`ParseError` carrying
the status to answer before closing the connection. No sockets, no clocks.

llhttp in its default (strict) mode checks most of the syntax; what it accepts and this module
rejects itself (what a valid request head is) is listed, with its tables, in
:mod:`refork.http.head`.

What llhttp gets wrong and refork gets right is in :mod:`refork.http.rare` (any token as a
method, a protocol name other than HTTP, chunk extensions with BWS): found only on llhttp's error
or, for the protocol name, on RTSP/ or ICE/ in a read, so the common path pays almost nothing.
Where a request starts is found by replaying the bytes since the last read that ended between
messages (kept up to MAX_HELD while a read ends inside one), so where the reads split a pipeline
does not matter.

Other behaviour worth knowing:

- Upgrade requests (``Connection: upgrade``) are served as ordinary requests; the server ignores
  the upgrade (RFC 9110 7.8) and keeps parsing HTTP after them. The one exception is the hand-off
  of a WebSocket opening handshake (``Request.websocket``) to a parser made with
  ``hand_off_websocket=True`` (the ASGI loop's): it returns that request and its EndOfMessage, then
  parses nothing more, and :attr:`RequestParser.upgraded` holds the bytes that followed the head
  (the start of the WebSocket stream) for the caller.
- Chunked trailers are validated, bounded, then dropped: never in Request.headers.
- Errors in a chunked body necessarily come after the Request event; EndOfMessage never follows,
  and loops only call the app on EndOfMessage.
- A ``#fragment`` in the target is cut from path and query (``target`` stays raw); an
  absolute-form target gives path and query, and its authority replaces the Host header's value
  (RFC 9112 3.2.2).
- After a request that does not keep the connection alive, later bytes are ignored: the loop
  answers that request and closes.
- An error raises at once; ParseError.events holds the requests completed before it in the same
  feed(), for a loop to answer first (both loops do, then answer the error and close).
- A limit of 0 means unlimited.
- A field over a limit is answered 431 once the bytes after it are well-formed, else 400: the
  status does not depend on where the reads were cut (see _over), with one exception:
- A line is bounded as it arrives (refork.http.arriving): a request line longer than max_request_line
  (and its CR) is refused 414, a field line (name, colon, whitespace, value, CR) longer than
  max_header_size + 4 is refused 431, as soon as that many bytes came without the line's end
  (llhttp would hold the line in memory until it ends). Whatever follows it is not waited for, so
  such a line followed by a malformed one is 431 when a read ended inside it, 400 when it came
  whole (the reason of such a refusal says ARRIVING).
- ``buffered`` is what a parser holds of a head in progress (the head so far, the bytes kept for
  a replay, an unknown method arriving), for a loop's per-worker budget.
- Known leniency left as llhttp has it: several spaces between request-line parts (pinned by a
  test so an llhttp upgrade is noticed).
"""

from __future__ import annotations

import sys
from typing import Any

from httptools import HttpParserError, HttpParserInvalidMethodError, HttpParserUpgrade

from refork.http.arriving import ARRIVING, ArrivingBytes
from refork.http.chunked import ChunkFraming
from refork.http.events import Body, Event, ParseError, Request
from refork.http.head import (
    CONNECTION,
    CONTENT_LENGTH,
    FORBIDDEN_TRAILERS,
    GOOD_HOSTS,
    HOST,
    HOST_CHARS,
    METHODS,
    SPECIAL,
    TRANSFER_ENCODING,
    Limits,
    absolute_form,
    transfer_codings,
)
from refork.http.llhttp import llhttp as _llhttp
from refork.http.rare import EOM, PLACEHOLDER, RESUME, RTSP_METHOD_WITH_HTTP, RareRequests

__all__ = ["ARRIVING", "Limits", "RequestParser", "ParseError"]

_UNLIMITED = sys.maxsize
# in the reason of a line refused before its end: the one status that depends on where the reads
# were cut (the whole line might have been followed by a malformed one: 400 then, see _over)


class RequestParser(RareRequests, ArrivingBytes):
    """Parse one connection's request stream (pipelining included) into events.

    The ``on_*`` methods are llhttp callbacks, bound once when httptools is created; they are not
    part of the API.
    """

    __slots__ = ()  # declared in RareRequests

    def __init__(self, limits: Limits = Limits(), *, hand_off_websocket: bool = False) -> None:
        # (a frozen default Limits is safe to share)
        self._max_line = limits.max_request_line or _UNLIMITED
        self._max_count = limits.max_header_count or _UNLIMITED
        self._max_field = limits.max_header_size or _UNLIMITED
        self._max_body = limits.max_body or _UNLIMITED
        # Bound on a whole head: llhttp buffers a header until its end, so without this a peer
        # could stream one endless header line into memory before any per-field check runs.
        if _UNLIMITED in (self._max_line, self._max_count, self._max_field):
            self._max_head = _UNLIMITED
        else:
            self._max_head = self._max_line + 4 + self._max_count * (self._max_field + 4)
        # A chunk-size line with its extensions (RFC 9112 7.1.1) is held to one field's size.
        self._max_chunk_line = min(self._max_field, 1 << 16)
        self._events: list[Event] = []
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._specials: list[tuple[bytes, bytes]] = []  # the framing-relevant subset of _headers
        self._ntrailers = 0
        self._request: Request | None = None
        self._keep_alive = True
        self.in_message = False  # from the first byte of a request until its EndOfMessage
        self._in_head = False
        self._head_started = False
        self._head_bytes = 0
        self.head_held = 0  # bytes of the head (or trailer section) in progress, after a read
        self._line = 0  # bytes of its line still arriving
        self._past_first = False  # its first line (a request line) has ended
        self._ended_in_body = False  # the last message's last bytes were Content-Length body bytes
        self._body_left = _UNLIMITED  # chunked body bytes still allowed by max_body
        self._upgrade_body = 0
        self._chunk_line = False  # in a chunk-size line (else, in a chunked body: data or trailers)
        self._method: str | None = None  # an unknown method fed to llhttp as PLACEHOLDER
        self._pending = b""  # the start of an unknown method, waiting for the rest of it
        # What llhttp was fed since the last read that ended between messages (None: not kept),
        # and how many messages completed in it: a read that begins inside a message can then
        # still be replayed from a boundary to find a pipelined unknown method (see _hold()).
        self._held: bytearray | None = bytearray()  # appended to: one byte per read stays linear
        self._held_done = 0
        # fed to a fresh llhttp (after what it was fed first), and the events before
        self._refed: tuple[bytes, memoryview, int] | None = None
        self._slow = False  # error, closed, upgrade body or pending: feed() takes _feed_slow()
        self._closed = False
        self._error: ParseError | None = None
        self._late: ParseError | None = None  # a field over a limit, raised at the next field (see _over)
        # The protocol-name check (see _check_protocol): what llhttp is being fed, whether it may
        # name another protocol than HTTP (0: not looked at yet, 1: no, 2: maybe), the same for
        # the earlier reads of the head in progress, and where _feed_rest() is in its bytes.
        self._data: bytes | bytearray | memoryview = b""
        self._scan = 0
        self._carry = 0
        self._rest: tuple[memoryview, bytes, int] | None = None
        self._framing: ChunkFraming | None = None  # reads chunk-size lines llhttp refuses
        self._hand_off = hand_off_websocket  # stop after a WebSocket handshake (see `upgraded`)
        self._ws_pending = False  # a WebSocket handshake's head was parsed: stop at llhttp's upgrade
        self._upgraded: bytes | None = None
        self._chunks = 0  # chunks completed in the current chunked body (see _chunk_error)
        self._p = _llhttp(self)

    @property
    def buffered(self) -> int:
        """Bytes this parser holds of the head (or trailer section) in progress: the head so far and
        what is kept of it for a replay, or an unknown method still arriving. (While a body streams,
        what is kept for a replay, at most _MAX_HELD, is the connection's own, like its socket's
        buffers: charging it would hold a budget that only reading on gives back.)"""
        head = self.head_held
        if head:
            held = self._held
            return head + (len(held) if held else 0)
        return len(self._pending)

    @property
    def upgraded(self) -> bytes | None:
        """After a WebSocket handshake request (hand-off mode): the bytes that followed its head in
        what was fed, for the WebSocket protocol; None before. The parser is done then: feed()
        returns nothing more."""
        return self._upgraded

    def release(self) -> None:
        """The connection is gone: let go of what the parser holds (llhttp's callbacks are this
        object's methods, a reference cycle: without this, a head in progress would wait for the
        garbage collector). feed() returns nothing from now on."""
        self._p = _RELEASED
        self._error = self._late = None  # (its traceback holds the frames that raised it, data and all)
        self._headers = []
        self._specials = []
        self._url = b""
        self._held = None
        self._refed = None
        self._pending = b""
        self._closed = self._slow = True
        self.head_held = self._line = 0

    def feed(self, data: bytes) -> list[Event]:
        """Parse more bytes; return the events they complete, in order."""
        if self._slow or not data:
            return self._feed_slow(data)
        events: list[Event] = []
        self._events = events
        self._head_started = False
        in_head = self._in_head
        began_inside = self.in_message
        self._data = data
        self._scan = self._carry
        try:
            try:
                self._p.feed_data(data)
            except HttpParserUpgrade as exc:
                self._held = None  # the scratch replay stops at an upgrade
                if self._ws_pending:
                    self._hand_over(data[exc.args[0] :])
                else:
                    self._feed_rest(data[exc.args[0] :])
            except HttpParserError as exc:
                held = self._held
                if isinstance(exc, HttpParserInvalidMethodError) or str(exc) == RTSP_METHOD_WITH_HTTP:
                    if began_inside and held is not None:  # replay from the boundary before `held`
                        rest = self._unknown_method(bytes(held) + data, False, exc, extra=self._held_done)
                    else:
                        rest = self._unknown_method(data, began_inside, exc)
                    self._feed_rest(rest, PLACEHOLDER)
                else:  # in a chunk-size line with BWS? (else the error stands)
                    stream = bytes(held) + data if held else data
                    rest = self._chunk_error(
                        exc, stream, held is not None, self._held_done if held else 0, 0, b""
                    )
                    self._feed_rest(rest, RESUME)
            if in_head and self._in_head and not self._head_started:
                # The whole chunk belonged to one unfinished head, chunk-size line or trailer section.
                self._head_bytes += len(data)
                if self._head_bytes > self._max_head:
                    raise self._overflow()
            if self._in_head and not self._chunk_line:
                self._measure(data, began_inside)
            elif self.head_held:
                self.head_held = self._line = 0
        except ParseError as exc:
            exc.events = _complete_messages(self._events)
            raise
        finally:
            self._data = b""  # (a read can be 256 KiB: not kept past its feed())
        if self.in_message:
            self._hold(data)
        elif self._held or self._held is None or self._refed is not None:
            self._between_requests()
        self._events = []  # nor its events (their body pieces are the caller's to keep)
        return events

    def _feed_slow(self, data: bytes) -> list[Event]:
        if self._error is not None:
            raise self._error
        if self._closed or not data:
            return []
        self._events = []
        began_inside = self.in_message
        self._head_started = False
        try:
            self._feed_slow_rest(data)
            if self._in_head and not self._chunk_line and self._framing is None:
                self._measure(data, began_inside)
            elif self.head_held:
                self.head_held = self._line = 0
        except ParseError as exc:
            exc.events = _complete_messages(self._events)
            raise
        finally:
            self._data = b""
        if self.in_message:
            self._hold(data)
        elif self._held or self._held is None or self._refed is not None:
            self._between_requests()
        events, self._events = self._events, []
        return events

    def _feed_slow_rest(self, data: bytes) -> None:
        if self._framing is not None:
            rest = self._feed_framing(memoryview(data))
            if rest is not None:
                self._feed_rest(rest, RESUME)
        elif self._pending:
            data = self._pending + data
            self._pending = b""
            self._set_slow()
            self._feed_rest(self._unknown_method(data, False, None), PLACEHOLDER)
        else:
            self._feed_rest(data)

    def _feed_rest(self, data: bytes | memoryview, prefix: bytes = b"") -> None:
        """Parse on from a message boundary (after an upgrade request's head, or an unknown method).

        An upgrade request's body, if any, is read here; then more HTTP. `data` is walked as a
        memoryview: slicing it copies nothing, however many requests it holds.
        """
        data = memoryview(data)  # `prefix`: what llhttp was fed of the current message before it
        while data and not self._closed:
            if self._upgrade_body:
                data = self._feed_upgrade_body(data, self._events)
                continue
            done = len(self._events)
            self._data, self._scan, self._rest = data, self._carry, (data, prefix, done)
            try:
                self._p.feed_data(data)
            except HttpParserUpgrade as exc:
                # llhttp stops after an upgrade request's head; we ignore the upgrade and go on
                # (unless it is a WebSocket handshake to hand over).
                self._held = None  # the scratch replay stops at an upgrade
                self._refed = None
                data = data[exc.args[0] :]
                if self._ws_pending:
                    self._hand_over(data)
                    return
                prefix = b""
                continue
            except HttpParserError as exc:
                self._rest = None
                if isinstance(exc, HttpParserInvalidMethodError) or str(exc) == RTSP_METHOD_WITH_HTTP:
                    data = self._unknown_method(data, False, exc, done, prefix)
                    prefix = PLACEHOLDER
                    continue
                data = self._chunk_error(exc, data, True, 0, done, prefix)
                prefix = RESUME
                continue
            finally:
                self._rest = None
            return

    def _hand_over(self, rest: bytes | memoryview) -> None:
        """A WebSocket handshake was parsed (its EndOfMessage too): keep what follows, parse no more."""
        self._ws_pending = False
        self._upgraded = bytes(rest)
        self._closed = self._slow = True

    def _feed_upgrade_body(self, data: memoryview, events: list[Event]) -> memoryview:
        """Hand out the Content-Length body of an upgrade request llhttp did not read."""
        n = self._upgrade_body
        chunk = data[:n]
        events.append(Body(bytes(chunk)))
        self._upgrade_body = n - len(chunk)
        self._set_slow()
        if not self._upgrade_body:
            self._ended_in_body = True
            self._events.append(EOM)
            self.in_message = False
            self._request = None
            if not self._keep_alive:
                self._closed = True
                self._slow = True
        return data[n:]

    # llhttp callbacks ------------------------------------------------------------------------
    # Hot path: every attribute access counts, so state is flat and per-message resets are few.

    def on_message_begin(self) -> None:
        if self._closed:  # after a request that closes: the rest of this read is never parsed
            raise _AfterClose
        self.in_message = self._in_head = self._head_started = True
        self._head_bytes = 0
        self._past_first = False
        self._url = b""
        self._headers = []
        self._specials = []

    def on_url(self, part: bytes) -> None:
        url = self._url = self._url + part if self._url else part
        if len(url) + 13 > self._max_line:  # shortest method (3) + 2 SP + "HTTP/1.1"
            raise self._fail(414, "request line too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._request is not None:
            self._trailer(name, value)
            return
        headers = self._headers
        if len(headers) >= self._max_count:
            self._over("too many header fields")
        elif len(name) + len(value) > self._max_field:
            self._over("header field too large")
        header = (name.lower(), value.rstrip(b" \t"))  # llhttp strips leading OWS only
        if header[0] in SPECIAL:
            self._specials.append(header)
        headers.append(header)

    def _trailer(self, name: bytes, value: bytes) -> None:
        """Chunked trailers: validated by llhttp, held to the header limits, then dropped.

        The section as a whole is bounded as it arrives (feed() counts it like a head); they
        never reach Request.headers.
        """
        self._ntrailers += 1
        if self._ntrailers > self._max_count:
            self._over("too many trailer fields")
        elif len(name) + len(value) > self._max_field:
            self._over("trailer field too large")
        elif name.lower() in FORBIDDEN_TRAILERS:
            raise self._fail(400, f"{name.decode('latin-1')} is not allowed in a trailer section")

    def _over(self, reason: str) -> None:
        """A field over a limit: 431, raised at the next callback (the next field, or the end of
        the section), not now. httptools reports a field only once the next field's name begins
        to arrive, so whether a malformed name right after it is seen first depends on where the
        reads were cut; deferring to the next field makes both orders give the same status: 400
        when the bytes right after the field are malformed, else 431. Bounded all the same: the
        section is counted as it arrives (feed()). The next field comes back here through the
        count check (the parser is done with either answer, so the limit is free to clobber)."""
        if self._late is not None:
            raise self._failed(self._late)
        self._late = ParseError(431, reason)
        self._max_count = -1

    def on_headers_complete(self) -> None:
        if self._late is not None:
            raise self._failed(self._late)
        p = self._p
        version = p.get_http_version()
        if version == "1.1":
            http11 = True
        elif version == "1.0":
            http11 = False
        elif version[0] == "1":  # HTTP/1.2 and later minors: served as 1.1 (RFC 9112 2.3)
            http11 = True
            version = "1.1"
        else:
            raise self._fail(505, f"HTTP version {version} not supported")
        raw_method = p.get_method()
        scan = self._scan  # do this read's bytes hold RTSP/ (see _check_protocol; ICE/: SOURCE)?
        if scan == 0:
            data = self._data
            # `82 in` (b"R", a memchr) first: most reads have no capital R and skip the find(); not
            # `b"RTSP/" in data`, which first tries the needle as an int and raises and clears a
            # TypeError doing so (about 2,500 instructions).
            scan = self._scan = (
                2 if type(data) is not bytes or (82 in data and data.find(b"RTSP/") >= 0) else 1
            )
        if scan == 2:  # maybe: look closer (rare)
            self._check_protocol(raw_method)
        method = METHODS.get(raw_method) or self._other_method(raw_method)
        url = self._url
        if len(url) + len(method) + 10 > self._max_line:
            raise self._fail(414, "request line too long")

        hosts = 0
        cl = te = conn = None
        expect = False
        for name, value in self._specials:
            if name == HOST:
                hosts += 1
                if value not in GOOD_HOSTS:
                    if value.translate(None, HOST_CHARS):
                        raise self._fail(400, "invalid Host header")
                    if len(GOOD_HOSTS) < 256:
                        GOOD_HOSTS.add(value)
            elif name == CONTENT_LENGTH:
                cl = int(value)  # llhttp has checked: digits only, no duplicate, no overflow
            elif name == TRANSFER_ENCODING:
                if te is not None:
                    raise self._fail(400, "multiple Transfer-Encoding headers")
                te = value.lower()
            elif name == CONNECTION:
                conn = value if conn is None else conn + b"," + value
            else:  # EXPECT
                expect = value.lower() == b"100-continue"
        if hosts != 1 and (http11 or hosts):
            raise self._fail(400, "multiple Host headers" if hosts else "missing Host header")
        if method == "CONNECT":
            raise self._fail(501, "CONNECT not supported")
        if url == b"*" and method != "OPTIONS":
            raise self._fail(400, "asterisk-form target is only for OPTIONS")

        chunked = False
        if te is not None:
            if not http11:
                raise self._fail(400, "Transfer-Encoding in an HTTP/1.0 request")
            if te != b"chunked":
                try:
                    transfer_codings(te)
                except ParseError as exc:
                    raise self._failed(exc) from None
            chunked = True
            self._chunks = 0
            self._body_left = self._max_body
            self._ntrailers = 0
            self._chunk_line = self._head_started = True  # the first chunk-size line follows
            self._head_bytes = self._max_head - self._max_chunk_line
        elif cl is not None and cl > self._max_body:
            raise self._fail(413, "request body too large")

        keep_alive = http11
        if conn is not None:
            tokens = conn.lower().replace(b" ", b"").replace(b"\t", b"").split(b",")
            if b"close" in tokens:
                keep_alive = False
            elif not http11:
                keep_alive = b"keep-alive" in tokens
        # llhttp refuses bytes after a request it considers final: agree with it.
        if keep_alive and not p.should_keep_alive():
            keep_alive = False
        self._keep_alive = keep_alive

        websocket = False
        if p.should_upgrade():
            if chunked:
                raise self._fail(400, "upgrade request with a chunked body")
            if cl:
                self._upgrade_body = cl
                self._slow = True
            elif method == "GET" and _wants_websocket(self._headers):
                websocket = True
                self._ws_pending = self._hand_off

        headers = self._headers
        if (url and url[0] == 47) or url == b"*":  # origin-form (b"/...", the common case), asterisk
            target = url
        else:
            try:
                target, headers = absolute_form(url, headers)
            except ParseError as exc:
                raise self._failed(exc) from None
        if 35 in target:  # b"#" (int membership: several times faster than a bytes needle)
            target = target.partition(b"#")[0]
        path, _, query = target.partition(b"?")

        request = self._request = Request(
            method,
            url,
            path,
            query,
            version,
            headers,
            keep_alive,
            expect and http11 and (chunked or bool(cl)),
            chunked,
            cl,
            websocket,
        )
        self._in_head = chunked  # a chunk-size line is counted like a head (see feed())
        self._events.append(request)

    def _other_method(self, raw: bytes) -> str:
        if raw == b"SOURCE" and self._scan != 2:  # llhttp takes ICE/ with SOURCE only
            self._check_protocol(raw)
        method = self._method
        if method is not None and raw == PLACEHOLDER:
            self._method = None
            return method
        return raw.decode("ascii")

    def _chunk_section(self, chunk_line: bool) -> None:
        """Start counting a chunk-size line (True) or a possible trailer section (False) in
        feed(), like a head: neither may grow without bound."""
        self._in_head = self._head_started = True
        self._chunk_line = chunk_line
        # feed() compares with _max_head; a chunk line gets the smaller _max_chunk_line budget.
        self._head_bytes = self._max_head - self._max_chunk_line if chunk_line else 0

    def on_chunk_header(self) -> None:
        self._chunk_section(False)  # data follows (on_body ends the section), or trailers do

    def on_chunk_complete(self) -> None:
        if self._late is not None:  # a trailer field over a limit (see _over)
            raise self._failed(self._late)
        if self._in_head:  # no data since the chunk header: the last chunk and its trailers
            self._in_head = False
        else:
            self._chunks += 1
            self._chunk_section(True)

    def on_body(self, data: bytes) -> None:
        if self._request.chunked:  # type: ignore[union-attr]  # a body follows a head
            self._in_head = False
            left = self._body_left = self._body_left - len(data)
            if left < 0:
                raise self._fail(413, "request body too large")
        self._events.append(Body(data))

    def on_message_complete(self) -> None:
        if self._upgrade_body:
            return  # llhttp skipped the body of an upgrade request: feed() reads it
        request = self._request
        self._ended_in_body = request is not None and not request.chunked and bool(request.content_length)
        self._events.append(EOM)
        self.in_message = False
        self._request = None
        if not self._keep_alive:
            self._closed = self._slow = True


class _Released:
    """What a released parser's llhttp is: nothing (see RequestParser.release)."""


_RELEASED: Any = _Released()


class _AfterClose(Exception):
    """Raised into llhttp to stop it at a message that begins after a closing request: llhttp may
    judge keep-alive otherwise (HTTP/1.0 with `keep-alive, close`), and what follows a close is
    never a request, valid or not (RFC 9112 9.3)."""


def _wants_websocket(headers: list[tuple[bytes, bytes]]) -> bool:
    """An ``Upgrade`` header naming websocket (llhttp checked ``Connection: upgrade``)."""
    for name, value in headers:
        if name == b"upgrade" and b"websocket" in value.lower().replace(b" ", b"").split(b","):
            return True
    return False


def _complete_messages(events: list[Event]) -> list[Event]:
    """The events of the requests that completed before an error (for ParseError.events)."""
    for i in range(len(events) - 1, -1, -1):
        if events[i] is EOM:
            return events[: i + 1]
    return []
