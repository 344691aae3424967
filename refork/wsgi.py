"""WHERE A WSGI APP IS CALLED (PEP 3333): environ, start_response, write(), file_wrapper.

Nothing here knows about sockets, selectors or processes: the connection loop hands in a
complete request and an :class:`Output`, and gets back the status and the number of body bytes
written, or a :class:`Streaming` response to resume when its socket can take more.
"""

from __future__ import annotations

import io
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

from refork.config import Config
from refork.http.body import EMPTY_INPUT, InputStream
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies, resolve_forwarded
from refork.http.response import ResponseFramer, has_control_char, simple_response

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

    def send(self, data: bytes) -> None:
        """Write (or queue) all of it; OSError when the client is gone or stopped reading."""

    def sendfile(self, fd: int, offset: int, count: int | None) -> int:
        """Write (or queue) a file span; returns the bytes taken (short only at end of file)."""

    @property
    def backlogged(self) -> bool:
        """Bytes wait in our buffer: do not pull more of the body now."""

    def flush(self) -> None:
        """Block until nothing waits (the legacy write() callable); OSError as send()."""


class _Callables:
    """An Output over blocking send / sendfile callables: never backlogged."""

    __slots__ = ("send", "_sendfile", "zero_copy")

    backlogged = False

    def __init__(self, send: Send, sendfile: SendFile | None) -> None:
        self.send = send
        self._sendfile = sendfile
        self.zero_copy = sendfile is not None

    def sendfile(self, fd: int, offset: int, count: int | None) -> int:
        assert self._sendfile is not None
        return self._sendfile(fd, offset, count)

    def flush(self) -> None:
        pass

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


# --------------------------------------------------------------------------------------------
# environ


_PLAIN, _HOST, _FORWARDED = 0, 1, 2
_HEADER_INFO: dict[bytes, tuple[str | None, int]] = {
    b"content-type": ("CONTENT_TYPE", _PLAIN),
    b"content-length": ("CONTENT_LENGTH", _PLAIN),
    b"host": ("HTTP_HOST", _HOST),
}


def _header_info(name: bytes) -> tuple[str | None, int]:
    """(CGI name, kind) for a header; a None name drops it: with underscores it would alias a
    dashed name (X_Forwarded_For vs X-Forwarded-For), a spoofing vector."""
    if b"_" in name:
        info: tuple[str | None, int] = (None, _PLAIN)
    else:
        key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
        info = (key, _FORWARDED if name.startswith(b"x-forwarded-") else _PLAIN)
    if len(_HEADER_INFO) < 512:
        _HEADER_INFO[name] = info
    return info


_PROTOCOLS = {"1.1": "HTTP/1.1", "1.0": "HTTP/1.0"}


def _split_host(host: str, default_port: str) -> tuple[str, str]:
    if host.startswith("["):
        end = host.find("]")
        if end > 0:
            rest = host[end + 1 :]
            return host[1:end], (rest[1:] if rest.startswith(":") and rest[1:] else default_port)
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        return name, port
    return host, default_port


class ErrorStream:
    """``wsgi.errors``: a text stream that goes to the "refork" error log, not a bare stderr."""

    def write(self, s: str) -> int:
        text = s.rstrip("\n")
        if text:
            log.error("%s", text)
        return len(s)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass


class EnvironBuilder:
    """Builds environs from a per-worker base dict that is copied, not rebuilt, per request."""

    def __init__(
        self,
        *,
        server: tuple[str, int] | str,
        url_scheme: str = "http",
        root_path: str = "",
        errors: Any = None,
        multithread: bool = False,
        multiprocess: bool = True,
        proxies: TrustedProxies | None = None,
        file_wrapper: Any = None,
    ) -> None:
        self.url_scheme = url_scheme
        self.root_path = root_path.rstrip("/")
        self.proxies = proxies if proxies is not None else TrustedProxies([])
        if isinstance(server, tuple):
            self.server_name, self.server_port = str(server[0]), str(server[1])
        else:  # unix socket: no meaningful address
            self.server_name, self.server_port = "localhost", ""
        self._hosts: dict[tuple[bytes, str], tuple[str, str]] = {}
        self.base: dict[str, Any] = {
            "SCRIPT_NAME": self.root_path,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": url_scheme,
            "wsgi.errors": errors if errors is not None else ErrorStream(),
            "wsgi.multithread": multithread,
            "wsgi.multiprocess": multiprocess,
            "wsgi.run_once": False,
            "wsgi.file_wrapper": file_wrapper if file_wrapper is not None else FileWrapper,
            "wsgi.input_terminated": True,
            "SERVER_SOFTWARE": "refork",
        }

    def _server(self, host: bytes | None, scheme: str) -> tuple[str, str]:
        default_port = "443" if scheme in ("https", "wss") else "80"
        if host is None:
            return self.server_name, self.server_port or default_port
        key = (host, scheme)
        hit = self._hosts.get(key)
        if hit is None:
            hit = _split_host(host.decode("latin-1"), default_port)
            if len(self._hosts) < 256:
                self._hosts[key] = hit
        return hit

    def build(self, request: Request, body: InputStream, client: tuple[str, int] | None) -> dict[str, Any]:
        env = self.base.copy()
        env["REQUEST_METHOD"] = request.method
        raw = request.path  # the parser has reduced an absolute-form target to its path
        path = unquote_to_bytes(raw).decode("latin-1") if b"%" in raw else raw.decode("latin-1")
        root = self.root_path
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :]
        env["PATH_INFO"] = path
        env["QUERY_STRING"] = request.query.decode("latin-1")
        env["RAW_URI"] = env["REQUEST_URI"] = request.target.decode("latin-1")
        env["SERVER_PROTOCOL"] = _PROTOCOLS.get(request.http_version) or "HTTP/" + request.http_version
        host = None
        forwarded = False
        for name, value in request.headers:
            info = _HEADER_INFO.get(name)
            if info is None:
                info = _header_info(name)
            key, kind = info
            if key is None:
                continue
            if key in env:  # a repeated field: join (cookies with "; ", RFC 6265)
                sep = "; " if key == "HTTP_COOKIE" else ","
                env[key] = env[key] + sep + value.decode("latin-1")
            else:
                env[key] = value.decode("latin-1")
            if kind:
                if kind == _HOST:
                    host = value
                else:
                    forwarded = True
        if request.content_length is not None or request.chunked:
            env["CONTENT_LENGTH"] = str(body.length)
        env["wsgi.input"] = body
        scheme = self.url_scheme
        if client is not None:
            peer = client[0]
            env["REMOTE_ADDR"] = peer
            env["REMOTE_PORT"] = str(client[1])
            if forwarded:
                scheme, addr = resolve_forwarded(request.headers, peer, scheme, self.proxies)
                if addr != peer and addr is not None:
                    env["REMOTE_ADDR"] = addr
                    del env["REMOTE_PORT"]
        elif forwarded:  # a unix-socket peer: trusted only as --forwarded-allow-ips says (`unix:`)
            scheme, addr = resolve_forwarded(request.headers, None, scheme, self.proxies)
            if addr is not None:
                env["REMOTE_ADDR"] = addr
        if scheme != self.url_scheme:
            env["wsgi.url_scheme"] = scheme
        env["SERVER_NAME"], env["SERVER_PORT"] = self._server(host, scheme)
        return env


# --------------------------------------------------------------------------------------------
# file_wrapper


class FileWrapper:
    """``wsgi.file_wrapper``: the loop sends it with sendfile() when it can, else in blocks."""

    def __init__(self, filelike: Any, blksize: int = 1 << 16) -> None:
        self.filelike = filelike
        self.blksize = blksize
        if hasattr(filelike, "close"):
            self.close = filelike.close

    def __iter__(self) -> FileWrapper:
        return self

    def __next__(self) -> bytes:
        data: bytes = self.filelike.read(self.blksize)
        if data:
            return data
        raise StopIteration


def _file_span(filelike: Any) -> tuple[int, int, int] | None:
    """(fd, offset, bytes to the end) when the object is a binary regular file: what sendfile needs."""
    if isinstance(filelike, io.TextIOBase):
        return None
    try:
        fd = filelike.fileno()
        offset = filelike.tell()
        if not isinstance(fd, int) or fd < 0:
            return None
        st = os.fstat(fd)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return fd, offset, max(st.st_size - offset, 0)


# --------------------------------------------------------------------------------------------
# start_response / write / the response body


class SendFailed(Exception):
    """Writing to the client failed (it went away): not an application error."""


_STATUS_CACHE: dict[str, tuple[int, bytes]] = {}
_HEADER_CACHE: dict[tuple[str, str], tuple[tuple[bytes, bytes], bool]] = {}
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _check_status(status: Any) -> tuple[int, bytes]:
    hit = _STATUS_CACHE.get(status) if type(status) is str else None
    if hit is not None:
        return hit
    if type(status) is not str:
        raise TypeError(f"WSGI status must be a str, got {type(status).__name__}")
    code = status[:3]
    if len(status) < 4 or not code.isdigit() or not code.isascii() or status[3] != " " or code[0] == "0":
        raise ValueError(f"WSGI status must look like '200 OK', got {status!r}")
    reason = status[4:].strip().encode("latin-1")
    if has_control_char(reason):
        raise ValueError(f"WSGI status contains a control character: {status!r}")
    hit = (int(code), reason)
    if len(_STATUS_CACHE) < 256:
        _STATUS_CACHE[status] = hit
    return hit


def _check_header(item: Any) -> tuple[tuple[bytes, bytes], bool]:
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


class _Exchange:
    """State of one response: what start_response set and whether the head went out."""

    __slots__ = ("framer", "out", "code", "reason", "headers", "has_length", "head_sent", "sent")

    def __init__(self, framer: ResponseFramer, out: Output) -> None:
        self.framer = framer
        self.out = out
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
        code, reason = _check_status(status)
        if type(headers) is not list:
            raise TypeError(f"WSGI headers must be a list, got {type(headers).__name__}")
        out = []
        has_length = False
        cache = _HEADER_CACHE
        for item in headers:
            hit = cache.get(item) if type(item) is tuple else None
            if hit is None:
                hit = _check_header(item)
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
                send(head + framer.body(b"".join(result)) + framer.end())
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
    span = _file_span(wrapper.filelike)
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
        log.error(
            "Error in WSGI app after the response head was sent: %s %s",
            environ.get("REQUEST_METHOD"),
            environ.get("RAW_URI"),
            exc_info=exc,
        )
        return ex.code, framer.body_bytes, False
    log.error("Error in WSGI app: %s %s", environ.get("REQUEST_METHOD"), environ.get("RAW_URI"), exc_info=exc)
    try:
        ex.out.send(simple_response(500, keep_alive=False))
    except OSError:
        pass
    return 500, 0, False


def start_wsgi(
    app: Callable[..., Any], environ: dict[str, Any], request: Request, out: Output, keep_alive: bool = True
) -> Outcome | Streaming:
    """Call the app for one complete request and write its response to `out`.

    Returns (status, body bytes, whether the connection may serve another request), or a
    :class:`Streaming` when a buffering `out` became backlogged first. keep_alive False is the
    loop's "Connection: close" (a draining worker). The iterable's close() is always called.
    """
    framer = ResponseFramer(request, server_keep_alive=keep_alive)
    ex = _Exchange(framer, out)
    result = None
    try:
        result = app(environ, ex.start_response)
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


# --------------------------------------------------------------------------------------------
# warm-up (in the mold, before forking)


def _discard(data: bytes) -> None:
    pass


def warmup_wsgi(app: Callable[..., Any], requests: list[Request], config: Config) -> list[int]:
    """Run each request through the app in-process (lazy imports, caches); returns the statuses.

    The real response path, so its caches (statuses, headers) are filled before the fork too.
    """
    builder = EnvironBuilder(
        server=("localhost", 80),
        root_path=config.root_path,
        multithread=config.threads > 1,
        proxies=TrustedProxies([]),
    )
    return [
        run_wsgi(app, builder.build(request, EMPTY_INPUT, ("127.0.0.1", 0)), request, _discard)[0]
        for request in requests
    ]
