"""The ``send()`` messages of one ASGI response, validated and framed into bytes (sans-IO).

Besides ``http.response.start`` / ``http.response.body`` it frames the Early Hints extension
(``http.response.early_hint``: a 103 interim response before the head), the two file extensions
(``http.response.pathsend`` and ``http.response.zerocopysend``: :meth:`ResponseState.file_frame`
gives the bytes around a file's contents, which the connection sends itself) and
``http.response.trailers`` (RFC 9112 7.1.2: sent as the last chunk's trailer section, only to a
request whose ``TE`` lists ``trailers``; otherwise dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from refork.http.events import Request
from refork.http.response import ResponseFramer, early_hints, has_control_char, status_line

try:
    from refork import _native  # typed by refork/_native.pyi
except ImportError:  # not built: the Python framer
    _native = None  # type: ignore[assignment]

log = logging.getLogger("refork")

# What frames a response: refork._native.ResponseFramer where the extension is built (the same
# class in Rust, held to the Python one by tests/asgi/test_native_framer.py), else the Python one.
Framer: Any = ResponseFramer
if _native is not None:
    _native.use_status_lines(status_line)
    Framer = _native.ResponseFramer

FILE_MESSAGES = frozenset({"http.response.pathsend", "http.response.zerocopysend"})
EARLY_HINT = "http.response.early_hint"
# the send() messages that are not the common start/body pair (cycle.py tests for them in one go)
OTHER_MESSAGES = FILE_MESSAGES | {EARLY_HINT}

# RFC 9110 6.5.1: fields a trailer section must not carry (framing, routing, the ones that would
# change how the message is handled); dropped with a debug line rather than failing the response.
_NOT_IN_TRAILERS = frozenset({
    b"content-length", b"transfer-encoding", b"content-encoding", b"content-type", b"content-range",
    b"trailer", b"host", b"connection", b"keep-alive", b"te", b"upgrade", b"set-cookie",
    b"authorization", b"cache-control", b"expires", b"date", b"location", b"retry-after", b"vary",
})  # fmt: skip
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def wants_trailers(request: Request) -> bool:
    """The request's ``TE`` header lists ``trailers`` and it is HTTP/1.1 (chunked is possible)."""
    if request.http_version != "1.1":
        return False
    for name, value in request.headers:
        if name == b"te" and b"trailers" in [v.split(b";")[0].strip() for v in value.lower().split(b",")]:
            return True
    return False


def early_hint_links(message: dict[str, Any]) -> list[bytes]:
    """The ``links`` of an ``http.response.early_hint`` message (the ASGI Early Hints extension):
    each a Link field value (RFC 8288), bytes without a control character (it would split the
    response); RuntimeError otherwise."""
    links = message.get("links", ())
    if isinstance(links, (bytes, str)):
        raise RuntimeError(f"'links' must be an iterable of byte strings, got {links!r}")
    out = []
    try:
        for link in links:
            if not isinstance(link, (bytes, bytearray, memoryview)):
                raise RuntimeError(f"early hint links must be byte strings, got {link!r}")
            value = bytes(link).strip(b" \t")
            if has_control_char(value):
                raise RuntimeError("an early hint link has a control character")
            out.append(value)
    except TypeError:
        raise RuntimeError(f"'links' must be an iterable of byte strings, got {links!r}") from None
    return out


class ResponseState:
    """Validate the ``send()`` messages of one response and frame them into bytes (sans-IO).

    The head is held back until the first body message so that a small response leaves in one
    write. ``keep_alive`` may be turned off until ``http.response.start`` arrives (graceful stop).
    """

    __slots__ = (
        "request", "keep_alive", "framer", "started", "complete", "status", "held_head", "trailers",
        "send_trailers", "body_ended", "file_sent", "trailer_fields", "headers", "will_keep_alive",
        "short_by",
    )  # fmt: skip

    def __init__(self, request: Request, *, keep_alive: bool = True) -> None:
        self.request = request
        self.keep_alive = keep_alive
        self.framer: Any = None
        self.started = False
        self.complete = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []  # the app's (http.response.start)
        self.held_head: bytes | None = None  # framed, held back for the first body message
        self.will_keep_alive = False  # after completion: may the connection serve another request?
        self.short_by = 0  # after completion: body the app's Content-Length promised and it did not send
        self.trailers = False  # the app announced http.response.trailers ("trailers": True)
        self.send_trailers = False  # ... and they go on the wire (TE: trailers, chunked)
        self.body_ended = False  # the last body message came; only trailers may follow
        self.file_sent = False  # an http.response.pathsend came (it cannot be mixed with body)
        self.trailer_fields: list[bytes] = []  # from messages with "more_trailers": True

    def feed(self, message: dict[str, Any]) -> bytes:
        """Bytes to write for this message (possibly empty); RuntimeError when it is out of order."""
        try:
            kind = message["type"]
        except (KeyError, TypeError):
            raise RuntimeError(f"ASGI message must be a dict with a 'type' key, got {message!r}") from None
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got {kind!r}")
            return self.start(message)
        if self.complete:
            raise RuntimeError(f"Unexpected ASGI message {kind!r} sent after the response completed")
        if self.body_ended:
            if kind != "http.response.trailers":
                raise RuntimeError(f"Expected ASGI message 'http.response.trailers', but got {kind!r}")
            return self._trailers(message)
        if kind != "http.response.body":
            if kind == "http.response.trailers":
                raise RuntimeError("'http.response.trailers' before the last 'http.response.body'")
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got {kind!r}")
        if self.file_sent:
            raise RuntimeError("'http.response.body' after 'http.response.pathsend'")
        body = message.get("body", b"")
        if body and type(body) is not bytes:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise RuntimeError(f"'body' must be bytes, got {type(body).__name__}")
            body = bytes(body)
        more = message.get("more_body", False)
        framer = self.framer
        out: bytes
        try:
            if more or self.trailers:
                out = framer.body(body) if body else b""
            else:
                out = framer.last(body)  # (the common case: one call frames the body and the end)
        except ValueError as exc:
            raise RuntimeError(f"Invalid response body: {exc}") from None
        if not more:
            if self.trailers:
                self.body_ended = True
            else:  # (_complete(), inline: once a response)
                self.complete = True
                self.will_keep_alive = bool(framer.keep_alive)
                length = framer.content_length
                if length is not None and not framer.no_body and framer.body_bytes < length:
                    self.short_by = length - framer.body_bytes
        head = self.held_head
        if head is not None:
            self.held_head = None
            return head + out
        return out

    def early_hint(self, message: dict[str, Any]) -> bytes:
        """The 103 Early Hints of an ``http.response.early_hint`` message: before the response
        head left (before ``http.response.start``, or after it while the head is held for the
        first body message), and never to an HTTP/1.0 client (RFC 9110 15.2); else b"" (the hint
        is dropped, as the extension lets a server do). RuntimeError for malformed links."""
        links = early_hint_links(message)
        if self.head_sent or self.request.http_version == "1.0":
            return b""
        return early_hints([(b"Link", link) for link in links])

    def start(self, message: dict[str, Any]) -> bytes:
        """An ``http.response.start`` (before any other message): its head is framed and held for
        the first body message; returns b"". RuntimeError for a bad status or headers."""
        status = message.get("status")
        if type(status) is not int or not 100 <= status <= 999:
            raise RuntimeError(f"'status' must be an int between 100 and 999, got {status!r}")
        if 100 <= status < 200:
            raise RuntimeError(f"Informational status {status} cannot be sent as the final response")
        headers = message.get("headers", ())
        if type(headers) is not list:
            headers = _check_headers(headers)
        if message.get("trailers", False):
            self.trailers = True
            if wants_trailers(self.request):
                self.send_trailers = True  # chunked: a Content-Length would leave no room for them
                headers = [(n, v) for n, v in headers if n.lower() != b"content-length"]
        framer = Framer(self.request, server_keep_alive=self.keep_alive)
        try:
            self.held_head = framer.head(status, headers)
        except (ValueError, TypeError, AttributeError) as exc:  # (the head checks each field as it goes)
            _check_headers(headers)  # headers that are not pairs of bytes: its message says so
            raise RuntimeError(f"Invalid response head: {exc}") from None
        self.framer = framer
        self.status = status
        self.headers = headers
        self.started = True
        return b""

    def _end_body(self) -> bytes:
        """The last body message: finish the response, unless trailers are still to come."""
        if self.trailers:
            self.body_ended = True
            return b""
        try:
            out: bytes = self.framer.end()
        except ValueError as exc:
            raise RuntimeError(f"Invalid response: {exc}") from None
        self._complete()
        return out

    def _complete(self) -> None:
        framer = self.framer
        self.complete = True
        self.will_keep_alive = bool(framer.keep_alive)
        length = framer.content_length
        if length is not None and not framer.no_body and framer.body_bytes < length:
            self.short_by = length - framer.body_bytes

    def _trailers(self, message: dict[str, Any]) -> bytes:
        fields = []
        for name, value in _check_headers(message.get("headers", ())):
            if not name or name.translate(None, _TOKEN) or has_control_char(value):
                raise RuntimeError(f"Invalid trailer field {(name, value)!r}")
            if name.lower() in _NOT_IN_TRAILERS:
                log.debug("dropped trailer field %r: not allowed in a trailer section", name)
                continue
            fields.append(b"%s: %s\r\n" % (name, value))
        collected = self.trailer_fields
        collected.extend(fields)
        if message.get("more_trailers", False):
            return b""
        framer = self.framer
        try:
            last: bytes = framer.end()
        except ValueError as exc:
            raise RuntimeError(f"Invalid response: {exc}") from None
        self._complete()
        if not (self.send_trailers and framer.chunked and not framer.no_body):
            if collected:
                log.debug("dropped response trailers: the request did not send 'TE: trailers'")
            return last
        return b"0\r\n" + b"".join(collected) + b"\r\n"

    def file_frame(self, kind: str, size: int, more_body: bool) -> tuple[bytes, bytes, bool]:
        """Frame `size` bytes of a file the connection sends itself (pathsend / zerocopysend).

        Returns (bytes before the file: the held head, a chunk header; bytes after it: the chunk's
        end and the end of the response; whether the file's bytes go out at all: not for HEAD,
        204, 304). RuntimeError when out of order or longer than the Content-Length.
        """
        if not self.started:
            raise RuntimeError(f"Expected ASGI message 'http.response.start', but got {kind!r}")
        if self.complete or self.body_ended:
            raise RuntimeError(f"Unexpected ASGI message {kind!r} sent after the response body ended")
        if self.file_sent:
            raise RuntimeError(f"Unexpected ASGI message {kind!r} after 'http.response.pathsend'")
        if kind == "http.response.pathsend":
            self.file_sent = True
            more_body = False  # path-send is the whole body
        framer = self.framer
        send = size > 0 and not framer.no_body
        limit = framer.content_length
        if send and not framer.chunked and limit is not None and framer.body_bytes + size > limit:
            framer.keep_alive = False
            raise RuntimeError(f"Invalid response body: longer than Content-Length {limit}")
        framer.body_bytes += size
        before = self.take_head()
        after = b""
        if send and framer.chunked:
            before += b"%x\r\n" % size
            after = b"\r\n"
        if not more_body:
            after += self._end_body()
        return before, after, send

    def take_head(self) -> bytes:
        """The held-back head, if no body message came to carry it; empty afterwards."""
        head = self.held_head
        self.held_head = None
        return head or b""

    @property
    def head_sent(self) -> bool:
        """The head left (or was handed out to be written): an error can no longer replace it."""
        return self.started and self.held_head is None

    @property
    def body_bytes(self) -> int:
        return int(self.framer.body_bytes) if self.framer is not None else 0


def _check_headers(headers: Iterable[Any]) -> list[tuple[bytes, bytes]]:
    """Headers as a list of (bytes, bytes); anything else is an app bug worth a clear message."""
    if type(headers) is list:
        for item in headers:
            if type(item) is not tuple or len(item) != 2:
                break
            if type(item[0]) is not bytes or type(item[1]) is not bytes:
                break
        else:
            return headers
    out: list[tuple[bytes, bytes]] = []
    try:
        for name, value in headers:
            if not isinstance(name, bytes) or not isinstance(value, bytes):
                raise RuntimeError(f"Response header names and values must be bytes, got {(name, value)!r}")
            out.append((name, value))
    except (TypeError, ValueError):
        raise RuntimeError(f"'headers' must be an iterable of [name, value] pairs, got {headers!r}") from None
    return out
