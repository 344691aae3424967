"""Sans-IO HTTP/1.1 response framing: status line, headers, Content-Length vs chunked, keep-alive.

:class:`ResponseFramer` turns what an app gives (status, headers, body pieces) into the bytes to
write for one request; the caller owns the socket. Decisions it makes:

- An app-supplied ``Content-Length`` is used as-is. More body than that raises ``ValueError``; less
  at :meth:`ResponseFramer.end` means the peer cannot know where the response stops, so the
  connection is closed (``keep_alive`` False).
- Without one: HTTP/1.1 requests get ``Transfer-Encoding: chunked``; HTTP/1.0 requests get a
  close-delimited body.
- No body for HEAD, 1xx, 204, 304: :meth:`ResponseFramer.body` swallows what it is given.
  Content-Length is kept for HEAD and 304 (it describes the selected representation) and dropped
  for 1xx and 204, where RFC 9110 forbids it.
- Hop-by-hop headers from the app (``Connection``, ``Transfer-Encoding``, ``Keep-Alive``) are
  dropped: framing and persistence are the server's. An app ``Connection: close`` is honoured by
  closing the connection.
- ``Date`` and ``Server: refork`` are added unless the app set them.
- The status line is always HTTP/1.1, also for HTTP/1.0 requests (RFC 9110 2.5).
"""

from __future__ import annotations

from email.utils import formatdate
from http import HTTPStatus
from time import time as _time

from refork.http.events import Request

__all__ = [
    "CONTINUE", "ResponseFramer", "early_hints", "has_control_char", "reason_phrase", "simple_response",
    "status_line",
]  # fmt: skip

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\n"

_REASONS = {s.value: s.phrase.encode("latin-1") for s in HTTPStatus}
_STATUS_LINES: dict[int | tuple[int, bytes], bytes] = {}  # status or (status, reason) -> line

# RFC 9110 token characters; a header name must consist of these only.
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

# Byte -> 0 for the control characters a field value or reason phrase must not hold (RFC 9110 5.5:
# CTL except HTAB; CR/LF would split the response, the others break or confuse clients), else 1;
# `0 in value.translate(_CTL_ZERO)` is as fast as three `in` tests.
_CTL_ZERO = bytes(0 if b < 32 and b != 9 or b == 127 else 1 for b in range(256))


def has_control_char(value: bytes) -> bool:
    """True if `value` holds a byte a header value or reason phrase must not (CTL but HTAB)."""
    return 0 in value.translate(_CTL_ZERO)


def early_hints(fields: list[tuple[bytes, bytes]]) -> bytes:
    """A 103 Early Hints interim response (RFC 8297) carrying `fields`, checked by the caller.

    The caller sends it only before the final response's head and never to an HTTP/1.0 client
    (RFC 9110 15.2: a 1xx must not go to one); a client that does not know 103 skips it.
    """
    return _EARLY_HINTS + b"".join([name + b": " + value + b"\r\n" for name, value in fields]) + b"\r\n"


_SERVER_LINE = b"Server: refork\r\n"
_CLOSE_LINE = b"Connection: close\r\n"
_KEEP_ALIVE_LINE = b"Connection: keep-alive\r\n"
_CHUNKED_LINE = b"Transfer-Encoding: chunked\r\n"
_LAST_CHUNK = b"0\r\n\r\n"

# What head() does with a header, by lower-cased name; absent means "copy it" (_PLAIN).
_PLAIN, _CONTENT_LENGTH, _HOP, _CONNECTION, _DATE, _SERVER = range(6)
_SPECIAL = {
    b"content-length": _CONTENT_LENGTH,
    b"transfer-encoding": _HOP,
    b"keep-alive": _HOP,
    b"connection": _CONNECTION,
    b"date": _DATE,
    b"server": _SERVER,
}

# Validated header names as the app spells them -> kind. Apps use a small set of names, so a dict
# hit replaces lower() + token check + lookup on every header of every response.
_NAME_KINDS: dict[bytes, int] = {}


def _name_kind(name: bytes) -> int:
    if not name or name.translate(None, _TOKEN):
        raise ValueError(f"invalid header name {name!r}")
    kind = _SPECIAL.get(name.lower(), _PLAIN)
    if len(_NAME_KINDS) < 4096:
        _NAME_KINDS[name] = kind
    return kind


_date_until = 0.0  # the cached Date line is valid until this time.time()
_date_line = b""


def _date_header() -> bytes:
    """b"Date: <IMF-fixdate>\\r\\n", cached per second: every response needs one."""
    global _date_until, _date_line
    now = _time()
    if now >= _date_until:
        second = int(now)
        _date_line = b"Date: " + formatdate(second, usegmt=True).encode("ascii") + b"\r\n"
        _date_until = second + 1.0
    return _date_line


def reason_phrase(status: int) -> bytes:
    """The standard reason phrase for a status, b"Unknown" for codes without one."""
    return _REASONS.get(status, b"Unknown")


def status_line(status: int, reason: bytes | None) -> bytes:
    """b"HTTP/1.1 200 OK\\r\\n", cached: WSGI apps pass their reason on every response."""
    key = status if reason is None else (status, reason)
    line = _STATUS_LINES.get(key)
    if line is None:
        if type(status) is not int or not 100 <= status <= 999:
            raise ValueError(f"invalid status code {status!r}")
        if reason is None:
            reason = reason_phrase(status)
        elif 0 in reason.translate(_CTL_ZERO):
            raise ValueError(f"invalid reason phrase {reason!r}")
        line = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        if len(_STATUS_LINES) < 1024:  # app-chosen reasons: bound the cache
            _STATUS_LINES[key] = line
    return line


_RETRY_LINE = b"Retry-After: 1\r\n"  # a server-made 503 or 507 is "busy now": a full spool or disk
_RETRY = frozenset((503, 507))


def simple_response(status: int, body: bytes | None = None, *, keep_alive: bool = False) -> bytes:
    """A complete server-generated response (errors mostly): text/plain, sized, closing by default.

    A 503 or a 507 carries ``Retry-After: 1``."""
    if body is None:
        body = reason_phrase(status) + b"\n"
    return b"".join(
        (
            status_line(status, None),
            b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n" % len(body),
            _date_header(),
            _SERVER_LINE,
            b"" if keep_alive else _CLOSE_LINE,
            _RETRY_LINE if status in _RETRY else b"",
            b"\r\n",
            body,
        )
    )


class ResponseFramer:
    """Frame one response to one request: pure state machine, returns bytes to write."""

    __slots__ = (
        "keep_alive",
        "chunked",
        "content_length",
        "body_bytes",
        "no_body",
        "status",
        "_request",
        "_state",
    )

    def __init__(self, request: Request, *, server_keep_alive: bool = True) -> None:
        self._request = request
        self.keep_alive: bool = request.keep_alive and server_keep_alive
        self.chunked = False
        self.content_length: int | None = None
        self.body_bytes = 0
        self.no_body = request.method == "HEAD"
        self.status = 0
        self._state = 0  # 0: before head, 1: head sent, 2: ended

    @property
    def http10(self) -> bool:
        """The request is HTTP/1.0: no interim (1xx) response may go to it (RFC 9110 15.2)."""
        return self._request.http_version == "1.0"

    def head(self, status: int, headers: list[tuple[bytes, bytes]], reason: bytes | None = None) -> bytes:
        """Status line and headers; decides the framing of the body."""
        if self._state:
            raise ValueError("response head already sent")
        line = _STATUS_LINES.get(status if reason is None else (status, reason))
        if line is None:
            line = status_line(status, reason)
        self.status = status
        if status < 200 or status == 204 or status == 304:
            self.no_body = True
        drop_length = status < 200 or status == 204
        parts = [line]
        append = parts.append
        extend = parts.extend
        content_length = None
        has_date = has_server = False
        for name, value in headers:
            kind = _NAME_KINDS.get(name)
            if kind is None:
                kind = _name_kind(name)
            if 0 in value.translate(_CTL_ZERO):
                raise ValueError(f"invalid value for header {name!r}: {value!r}")
            if kind:
                if kind == _CONTENT_LENGTH:
                    if content_length is None and value.isdigit():  # isdigit: no sign, space, "_"
                        content_length = int(value)
                    else:
                        content_length = self._content_length(value, content_length)
                    if drop_length:
                        continue
                elif kind == _HOP:
                    continue
                elif kind == _CONNECTION:
                    if b"close" in value.lower().replace(b" ", b"").split(b","):
                        self.keep_alive = False
                    continue
                elif kind == _DATE:
                    has_date = True
                else:
                    has_server = True
            extend((name, b": ", value, b"\r\n"))

        if self.no_body:
            if not drop_length:
                self.content_length = content_length
        elif content_length is not None:
            self.content_length = content_length
        elif self._request.http_version == "1.1":
            self.chunked = True
            append(_CHUNKED_LINE)
        else:
            self.keep_alive = False  # HTTP/1.0 without a length: the close delimits the body

        if not has_date:
            append(_date_line if _time() < _date_until else _date_header())
        if not has_server:
            append(_SERVER_LINE)
        if not self.keep_alive:
            append(_CLOSE_LINE)
        elif self._request.http_version == "1.0":
            append(_KEEP_ALIVE_LINE)
        append(b"\r\n")
        self._state = 1
        return b"".join(parts)

    @staticmethod
    def _content_length(value: bytes, previous: int | None) -> int:
        if not value.isdigit():  # also refuses signs, spaces, underscores and empty
            raise ValueError(f"invalid Content-Length {value!r}")
        length = int(value)
        if previous is not None and previous != length:
            raise ValueError("conflicting Content-Length headers")
        return length

    def body(self, data: bytes) -> bytes:
        """Bytes to write for one piece of body (b"" when there is nothing to send)."""
        if self._state != 1:
            raise ValueError("body() before head() or after end()")
        size = len(data)
        sent = self.body_bytes = self.body_bytes + size
        if self.no_body or not size:
            return b""
        if self.chunked:
            return b"%x\r\n%s\r\n" % (size, data)
        if self.content_length is not None and sent > self.content_length:
            self.keep_alive = False
            raise ValueError(f"response body longer than Content-Length {self.content_length}")
        return data

    def last(self, data: bytes) -> bytes:
        """body(data) then end() in one call: the response's last (often its only) piece of body."""
        if self._state != 1:
            raise ValueError("body() before head() or after end()")
        size = len(data)
        sent = self.body_bytes = self.body_bytes + size
        if self.no_body:
            self._state = 2
            return b""
        if self.chunked:
            self._state = 2
            return b"%x\r\n%s\r\n0\r\n\r\n" % (size, data) if size else _LAST_CHUNK
        length = self.content_length
        if length is not None and sent != length:
            self.keep_alive = False  # longer: refused below; shorter: the peer waits on, for nothing
            if sent > length:
                raise ValueError(f"response body longer than Content-Length {length}")
        self._state = 2
        return data

    def end(self) -> bytes:
        """Bytes that finish the response; afterwards keep_alive is final."""
        if self._state != 1:
            raise ValueError("end() before head() or called twice")
        self._state = 2
        if self.chunked:
            return _LAST_CHUNK
        if self.content_length is not None and not self.no_body and self.body_bytes < self.content_length:
            self.keep_alive = False  # the peer is still waiting for bytes that never come
        return b""
