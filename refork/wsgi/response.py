"""Calling a WSGI app and writing its response: start_response, write(), the body iterable.

The connection loop hands in a complete request and an :class:`Output`, and gets back the
status and the number of body bytes written, or a :class:`Streaming` response to resume when
its socket can take more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from refork.http.events import Request
from refork.http.response import ResponseFramer, early_hints, has_control_char, simple_response
from refork.wsgi.files import FileWrapper, file_span

log = logging.getLogger("refork")

Send = Callable[[bytes], None]
SendFile = Callable[[int, int, "int | None"], int]  # (fd, offset, count or None = to EOF) -> sent
Outcome = tuple[int, int, bool]  # status, body bytes, whether the connection may serve another request


class Output(Protocol):
    """Where a response goes: the connection, blocking or buffering.

    A buffering output (the single-thread loop) takes what the socket takes now and keeps the
    rest; while it keeps anything (``backlogged``) no more of the body is pulled from the app.
    """

    zero_copy: bool  # sendfile() is available
    exchange: Any  # the _Exchange of the response being written (for the access log)

    def send(self, data: bytes) -> None:
        """Write (or queue) all of it; OSError when the client is gone or stopped reading."""

    def sendfile(self, fd: int, offset: int, count: int | None) -> int:
        """Write (or queue) a file span; returns the bytes taken (short only at end of file)."""

    @property
    def backlogged(self) -> bool:
        """Bytes wait in our buffer: do not pull more of the body now."""

    def flush(self) -> None:
        """Block until nothing waits (the legacy write() callable); OSError as send()."""

    def hint(self, data: bytes) -> None:
        """Write an interim response if the socket takes it now, else drop it (it is advisory)."""


class _Callables:
    """An Output over blocking send / sendfile callables: never backlogged."""

    __slots__ = ("send", "_sendfile", "zero_copy", "exchange")

    backlogged = False

    def __init__(self, send: Send, sendfile: SendFile | None) -> None:
        self.send = send
        self._sendfile = sendfile
        self.zero_copy = sendfile is not None
        self.exchange: Any = None

    def sendfile(self, fd: int, offset: int, count: int | None) -> int:
        assert self._sendfile is not None
        return self._sendfile(fd, offset, count)

    def flush(self) -> None:
        pass

    def hint(self, data: bytes) -> None:
        self.send(data)


# Refused from an app (PEP 3333). "Connection" is not among them: the framer drops it and honours
# "close" by closing after the response, which is what an app sending it wants.
HOP_BY_HOP = frozenset(
    {
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)

_JOIN_LIMIT = 1 << 16  # list bodies up to this size are sent with the head in one write


class SendFailed(Exception):
    """Writing to the client failed (it went away): not an application error."""


_STATUS_CACHE: dict[str, tuple[int, bytes]] = {}
_HEADER_CACHE: dict[tuple[str, str], tuple[tuple[bytes, bytes], bool]] = {}
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def check_status(status: Any) -> tuple[int, bytes]:
    hit = _STATUS_CACHE.get(status) if type(status) is str else None
    if hit is not None:
        return hit
    if type(status) is not str:
        raise TypeError(f"WSGI status must be a str, got {type(status).__name__}")
    code = status[:3]
    if len(status) < 4 or not code.isdigit() or not code.isascii() or status[3] != " " or code[0] == "0":
        raise ValueError(f"WSGI status must look like '200 OK', got {status!r}")
    if code[0] == "1":  # a final response: 1xx is interim only (RFC 9110 15.2), and a client
        # would pair the next response with this request (the ASGI path refuses it too)
        raise ValueError(f"WSGI status {status!r} is informational (1xx): not a final response")
    reason = status[4:].strip().encode("latin-1")
    if has_control_char(reason):
        raise ValueError(f"WSGI status contains a control character: {status!r}")
    hit = (int(code), reason)
    if len(_STATUS_CACHE) < 256:
        _STATUS_CACHE[status] = hit
    return hit


def check_header(item: Any) -> tuple[tuple[bytes, bytes], bool]:
    """Validate one (name, value) pair; returns it encoded and whether it is Content-Length."""
    if type(item) is not tuple or len(item) != 2:
        raise TypeError(f"WSGI header must be a (name, value) tuple, got {item!r}")
    name, value = item
    if type(name) is not str:
        raise TypeError(f"WSGI header name must be a str, got {type(name).__name__}")
    if type(value) is not str:
        raise TypeError(f"WSGI header value must be a str, got {type(value).__name__}")
    raw_name = name.encode("latin-1")
    if not raw_name or not _TOKEN.issuperset(raw_name):
        raise ValueError(f"invalid WSGI header name {name!r}")
    lower = name.lower()
    if lower in HOP_BY_HOP:
        raise ValueError(f"hop-by-hop header {name!r} is not allowed from a WSGI app (PEP 3333)")
    raw = value.encode("latin-1")
    if has_control_char(raw):  # CR/LF would split the response; other CTLs are invalid too
        raise ValueError(f"WSGI header {name!r} has a control character in its value")
    hit = ((raw_name, raw), lower == "content-length")
    if len(_HEADER_CACHE) < 4096:  # most apps repeat the same few pairs on every response
        _HEADER_CACHE[item] = hit
    return hit


def _hint_field(name: Any, value: Any) -> tuple[bytes, bytes]:
    """One header of ``wsgi.early_hints``, as gunicorn takes it: str or bytes (latin-1), the value
    without surrounding spaces and tabs. ValueError for a name that is not a token or a value with a
    control character (either would let the app split the response)."""
    raw_name = name.encode("latin-1") if type(name) is str else name
    raw = value.encode("latin-1") if type(value) is str else value
    if type(raw_name) is not bytes or type(raw) is not bytes:
        raise TypeError(f"an early hint header is a pair of str or bytes, not {(name, value)!r}")
    if not raw_name or not _TOKEN.issuperset(raw_name):
        raise ValueError(f"invalid early hint header name {name!r}")
    if has_control_char(raw):  # (the name only: the value may hold what should not travel on)
        raise ValueError(f"early hint header {name!r} has a control character in its value")
    return raw_name, raw.strip(b" \t")


def hint_fields(headers: Iterable[tuple[Any, Any]]) -> list[tuple[bytes, bytes]]:
    """The headers of a ``wsgi.early_hints(headers)`` call, checked (see _hint_field)."""
    return [_hint_field(name, value) for name, value in headers]


def hint_response(headers: Iterable[tuple[Any, Any]]) -> bytes:
    """The 103 Early Hints of a ``wsgi.early_hints(headers)`` call, its headers checked."""
    return early_hints(hint_fields(headers))


class _Exchange:
    """State of one response: what start_response set and whether the head went out."""

    __slots__ = ("framer", "out", "code", "reason", "headers", "has_length", "head_sent", "sent")

    def __init__(self, framer: ResponseFramer, out: Output) -> None:
        self.framer = framer
        self.out = out
        out.exchange = self
        self.code = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.has_length = False
        self.head_sent = False  # framed: the framer's head is done, it cannot be replaced
        self.sent = False  # some bytes reached the socket: too late for a 500

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Send:
        if exc_info is not None:
            try:
                if self.head_sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.code:
            raise AssertionError("start_response() called a second time without exc_info")
        code, reason = check_status(status)
        if type(headers) is not list:
            raise TypeError(f"WSGI headers must be a list, got {type(headers).__name__}")
        out = []
        has_length = False
        cache = _HEADER_CACHE
        for item in headers:
            hit = cache.get(item) if type(item) is tuple else None
            if hit is None:
                hit = check_header(item)
            if hit[1]:
                has_length = True
            out.append(hit[0])
        self.code = code
        self.reason = reason
        self.headers = out
        self.has_length = has_length
        return self.write

    def head(self, body_length: int | None = None) -> bytes:
        """Frame the status line and headers; `body_length` adds Content-Length if the app had none."""
        if not self.code:
            raise AssertionError("the WSGI app did not call start_response()")
        headers = self.headers
        code = self.code
        if body_length is not None and not self.has_length and code >= 200 and code not in (204, 304):
            headers = [*headers, (b"Content-Length", b"%d" % body_length)]
        self.head_sent = True
        return self.framer.head(code, headers, self.reason)

    def send(self, data: bytes) -> None:
        try:
            self.out.send(data)
        except OSError as e:
            raise SendFailed(str(e)) from e
        self.sent = True

    def early_hints(self, headers: Iterable[tuple[str | bytes, str | bytes]]) -> None:
        """``wsgi.early_hints`` (gunicorn's API): a 103 Early Hints interim response carrying
        `headers` (``[("Link", "</style.css>; rel=preload; as=style")]``) before the final one.

        Ignored, as gunicorn does, once the response head is out and for an HTTP/1.0 client (RFC
        9110 15.2). Each call is one 103. Advisory: written if the socket takes it now, else
        dropped (never waited for); a 500 may still follow it.
        """
        if self.head_sent or self.framer.http10:
            return
        data = hint_response(headers)
        try:
            self.out.hint(data)
        except OSError:
            pass  # the client is gone: the response's own send finds out

    def write(self, data: bytes) -> None:
        """The legacy write() callable: unbuffered, so the head goes out with the first write.

        It returns only once the bytes are written (it blocks its thread, bounded by the write
        timeout): the app called it and will call it again, there is no body to pull later.
        """
        if type(data) is not bytes:
            raise TypeError(f"write() takes bytes, got {type(data).__name__}")
        if self.head_sent:
            if data:
                self.send(self.framer.body(data))
        elif self.code:
            if data:
                self.send(self.head() + self.framer.body(data))
        else:
            raise AssertionError("write() called before start_response()")
        try:
            self.out.flush()
        except OSError as e:
            raise SendFailed(str(e)) from e


def _bytes_items(result: Any) -> int | None:
    """Total length of a list/tuple body of bytes (None if it is anything else)."""
    total = 0
    for item in result:
        if type(item) is not bytes:
            return None
        total += len(item)
    return total


def _send_result(ex: _Exchange, result: Iterable[bytes]) -> Iterator[bytes] | None:
    """Send the response; the body items still to pull when the output became backlogged."""
    framer = ex.framer
    send = ex.send
    kind = type(result)
    if (kind is list or kind is tuple) and not ex.head_sent:
        total = _bytes_items(result)
        if total is not None:
            head = ex.head(total)
            if total <= _JOIN_LIMIT:  # one write; copying a small body beats a second syscall
                # (joining a one-item list returns the item itself: no copy in the common case)
                send(head + framer.last(b"".join(result)))
                return None
            send(head)
            return _pull(ex, iter(result))
    if kind is FileWrapper and not ex.head_sent and _send_file(ex, result):  # type: ignore[arg-type]
        return None
    return _pull(ex, iter(result))


def _pull(ex: _Exchange, items: Iterator[bytes]) -> Iterator[bytes] | None:
    """Pull body items and send them until the end (None) or until the output is backlogged."""
    framer = ex.framer
    send = ex.send
    out = ex.out
    for data in items:
        if type(data) is not bytes:
            raise TypeError(f"WSGI body items must be bytes, got {type(data).__name__}")
        if not data:
            continue
        if ex.head_sent:
            body = framer.body(data)
            if not body:  # HEAD: nothing goes out
                continue
            send(body)
        else:
            send(ex.head() + framer.body(data))
        if out.backlogged:
            return items
    if ex.head_sent:
        tail = framer.end()
        if tail:
            send(tail)
    else:
        send(ex.head(0) + framer.end())
    return None


def _send_file(ex: _Exchange, wrapper: FileWrapper) -> bool:
    """Zero-copy path for wsgi.file_wrapper; False means read blocks (the head may be out already).

    A regular file's size gives the Content-Length when the app set none, so no chunking.
    """
    span = file_span(wrapper.filelike)
    if span is None:
        return False
    fd, offset, remaining = span
    if not ex.code:
        raise AssertionError("the WSGI app did not call start_response()")
    framer = ex.framer
    head = ex.head(remaining)
    if framer.no_body:
        ex.send(head + framer.end())
        return True
    if framer.chunked or not ex.out.zero_copy:
        ex.send(head)  # head is out: the block loop continues after it
        return False
    ex.send(head)
    count = framer.content_length
    try:
        sent = ex.out.sendfile(fd, offset, count)
    except OSError as e:
        raise SendFailed(str(e)) from e
    framer.body_bytes += sent  # these bytes bypassed framer.body()
    if count is not None and sent < count:
        raise RuntimeError(f"file_wrapper: file ended after {sent} of {count} bytes")
    tail = framer.end()
    if tail:
        ex.send(tail)
    return True


class Streaming:
    """A response the app has started whose body waits for the client to read (threads == 1).

    The loop calls :meth:`resume` when the socket took everything buffered; the body iterable
    is pulled only then, so a client that never reads costs one buffered item, not the body.
    """

    __slots__ = ("ex", "items", "result", "environ")

    def __init__(
        self, ex: _Exchange, items: Iterator[bytes] | None, result: Any, environ: dict[str, Any]
    ) -> None:
        self.ex = ex
        self.items = items  # None: all of the body is produced, only buffered bytes are left
        self.result = result
        self.environ = environ

    @property
    def status(self) -> int:
        return self.ex.code

    def resume(self) -> Outcome | None:
        """Pull more of the body; the outcome once it is all produced and written, else None."""
        items = self.items
        if items is not None:
            try:
                items = self.items = _pull(self.ex, items)
            except Exception as exc:
                return _finish(self.ex, self.environ, self.result, exc)
            except BaseException:
                _close(self.result)
                raise
        if items is not None or self.ex.out.backlogged:
            return None
        return _finish(self.ex, self.environ, self.result)

    def abandon(self) -> Outcome:
        """The connection is cut (write timeout, shutdown): close the iterable; the outcome to log."""
        ex = self.ex
        try:
            _close(self.result)
        except Exception:
            log.exception("Error closing a WSGI response body")
        return ex.code, ex.framer.body_bytes, False


def _close(result: Any) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()


def closing_failed(environ: dict[str, Any], exc: BaseException) -> None:
    """The line for an app error once the response head is out (the connection then closes)."""
    log.error("Error in WSGI app after the response head was sent: %s %s", environ.get("REQUEST_METHOD"),
              environ.get("RAW_URI"), exc_info=exc)  # fmt: skip


class Prefetched:
    """A response body whose first items a native engine (refork._native) pulled before it handed
    the response to this module: those items, then the rest of the body, or the exception pulling
    the next one raised; close() is the app's."""

    __slots__ = ("items", "rest", "error", "result")

    def __init__(self, items: list[Any], rest: Iterator[Any] | None, result: Any,
                 error: Exception | None = None) -> None:  # fmt: skip
        self.items = items
        self.rest = rest
        self.error = error
        self.result = result

    def __iter__(self) -> Iterator[Any]:
        yield from self.items
        if self.error is not None:
            raise self.error
        if self.rest is not None:
            yield from self.rest

    def close(self) -> None:
        _close(self.result)


def _finish(ex: _Exchange, environ: dict[str, Any], result: Any, exc: Exception | None = None) -> Outcome:
    """Close the iterable (always) and turn the response's end, or its failure, into the outcome.

    An app error before the head went out becomes a 500; after it, the connection is closed.
    """
    try:
        _close(result)
    except Exception as e:
        exc = exc or e
    framer = ex.framer
    if exc is None:
        return ex.code, framer.body_bytes, framer.keep_alive
    if isinstance(exc, SendFailed):
        return ex.code or 499, framer.body_bytes, False
    if ex.sent:
        closing_failed(environ, exc)
        return ex.code, framer.body_bytes, False
    log.error("Error in WSGI app: %s %s", environ.get("REQUEST_METHOD"), environ.get("RAW_URI"), exc_info=exc)
    ex.head_sent = True  # (an early hint after this final response is ignored)
    try:
        ex.out.send(simple_response(500, keep_alive=False))
    except OSError:
        pass
    return 500, 0, False


def start_wsgi(
    app: Callable[..., Any],
    environ: dict[str, Any],
    request: Request,
    out: Output,
    keep_alive: bool = True,
    frame: Callable[[_Exchange, ResponseFramer, Any, Request], bool] | None = None,
) -> Outcome | Streaming:
    """Call the app for one complete request and write its response to `out`.

    Returns (status, body bytes, whether the connection may serve another request), or a
    :class:`Streaming` when a buffering `out` became backlogged first. keep_alive False is the
    loop's "Connection: close" (a draining worker). The iterable's close() is always called.
    """
    framer = ResponseFramer(request, server_keep_alive=keep_alive)
    ex = _Exchange(framer, out)
    environ["wsgi.early_hints"] = ex.early_hints
    try:
        result = app(environ, ex.start_response)
    except Exception as exc:
        return _finish(ex, environ, None, exc)
    return continue_wsgi(ex, environ, request, result, frame)


def continue_wsgi(
    ex: _Exchange,
    environ: dict[str, Any],
    request: Request,
    result: Any,
    frame: Callable[[_Exchange, ResponseFramer, Any, Request], bool] | None = None,
    exc: Exception | None = None,
) -> Outcome | Streaming:
    """The rest of :func:`start_wsgi` once the app returned `result` (or raised `exc`): send the
    response. The native engine (refork._native) calls the app itself and continues here for
    every response it does not frame."""
    if exc is not None:
        return _finish(ex, environ, result, exc)
    framer = ex.framer
    out = ex.out
    try:
        if frame is not None and frame(ex, framer, result, request):
            items = None  # sent whole by a faster framer (refork.serving.wsgi.native_parts)
        else:
            items = _send_result(ex, result)
    except Exception as exc:
        return _finish(ex, environ, result, exc)
    except BaseException:
        _close(result)
        raise
    if items is not None or out.backlogged:
        return Streaming(ex, items, result, environ)
    if getattr(result, "close", None) is None:  # the common list body: nothing to close
        return ex.code, framer.body_bytes, framer.keep_alive
    return _finish(ex, environ, result)


def run_wsgi(
    app: Callable[..., Any],
    environ: dict[str, Any],
    request: Request,
    send: Send,
    sendfile: SendFile | None = None,
    keep_alive: bool = True,
) -> Outcome:
    """:func:`start_wsgi` over blocking `send` / `sendfile` callables (warm-up, tests)."""
    outcome = start_wsgi(app, environ, request, _Callables(send, sendfile), keep_alive)
    assert not isinstance(outcome, Streaming)  # a blocking output is never backlogged
    return outcome
