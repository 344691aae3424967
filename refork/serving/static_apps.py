"""The static mounts in front of the app: a request under a mount never reaches it.

serve() wraps the app once per worker, so every loop answers static requests the same way (the
native engine and the pool engine, the Python loop, asyncio and uvloop, HTTP/1.1 and HTTP/2, TLS
or not). A small file's answer is its bytes (the native engines frame them without Python); a
bigger one is a ``wsgi.file_wrapper`` (sendfile on plain connections, the native engines' too) or
an ASGI ``http.response.zerocopysend`` (os.sendfile beside the transport; read and write over
TLS). A request under no mount costs one startswith.
On the native engines (no access log, no request hooks) a plain 200 is also recorded in the
engine's static cache (native/src/static_files), which answers the same request again itself,
checking the files with one stat each, with no Python at all (the pool engine's I/O thread: not
even the GIL).
Static answers go to the access log like any response and are counted apart
(``refork_static_requests_total`` by status class), never among the app's requests: counting one
marks its request (WorkerControl.static_count), which the worker's clock then leaves out.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from refork.config import Config
from refork.serving.static import Answer, Mount, StaticFiles
from refork.wsgi import FileWrapper

log = logging.getLogger("refork")
_ABSOLUTE = ("http://", "https://")
Count = Callable[[int], None]  # a static answer's status, for the metrics
_REASONS = {200: "OK", 206: "Partial Content", 304: "Not Modified", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 416: "Range Not Satisfiable"}  # fmt: skip


def static_files(config: Config) -> StaticFiles | None:
    """The worker's mounts (--static; the worker runs in --chdir already), None when there are
    none. A directory gone since the start (checked then: refork.serving.check_static) answers 404s."""
    if not config.static:
        return None
    mounts = [Mount.parse(spec, check=False) for spec in config.static]
    for spec, mount in zip(config.static, mounts, strict=True):
        if not os.path.isdir(mount.root):
            log.warning("--static %s: not a directory (any more): its requests are answered 404", spec)
    return StaticFiles(mounts, config.static_max_age, config.static_follow_symlinks)


def wrap(app: Any, interface: str, files: StaticFiles, count: Count, replay: bool = False) -> Any:
    """The app with the mounts answered in front of it; `replay`: their plain 200s recorded for
    the native engine (a WSGI app on it)."""
    if interface == "asgi":
        return StaticAsgi(app, files, count)
    return StaticWsgi(app, files, count, replay)


class StaticWsgi:
    """A WSGI app: the mounts' requests answered here, the rest passed to the app."""

    def __init__(self, app: Any, files: StaticFiles, count: Count, replay: bool = False) -> None:
        self.app = app
        self.files = files
        self.count = count
        self.prefixes = tuple(m.prefix.decode("latin-1") for m in files.mounts)
        self.remember = _cache(replay)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        target = environ.get("RAW_URI") or environ.get("PATH_INFO", "")
        if target.startswith(_ABSOLUTE):  # absolute-form (a proxy's request): the path after the host
            target = "/" + target.split("/", 3)[-1] if target.count("/") >= 3 else "/"
        if not target.startswith(self.prefixes):
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        headers = {
            "if-none-match": environ.get("HTTP_IF_NONE_MATCH"),
            "if-modified-since": environ.get("HTTP_IF_MODIFIED_SINCE"),
            "range": environ.get("HTTP_RANGE"),
            "if-range": environ.get("HTTP_IF_RANGE"),
            "accept-encoding": environ.get("HTTP_ACCEPT_ENCODING"),
        }
        answer = self.files.answer(environ["REQUEST_METHOD"], target.encode("latin-1"),
                                   {k: v for k, v in headers.items() if v is not None})  # fmt: skip
        if answer is None:
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        self.count(answer.status)
        head = _head(answer, bytes)
        if answer.source and self.remember is not None and "RAW_URI" in environ:
            coding = headers["accept-encoding"]
            self.remember(environ["REQUEST_METHOD"], environ["RAW_URI"].encode("latin-1"),
                          coding.encode("latin-1") if coding is not None else None, head, answer.source,
                          answer.path if answer.file is not None else None,
                          answer.body if answer.file is None and answer.body else None)  # fmt: skip
        start_response(_status_line(answer), [(n.decode("latin-1"), v.decode("latin-1")) for n, v in head])
        if answer.file is None:
            return [answer.body] if answer.body else []
        f = answer.file
        if answer.status == 206:  # a part: read in blocks (a file_wrapper is sent to its end)
            return _Span(f, answer.offset, answer.count)
        wrapper = environ.get("wsgi.file_wrapper", FileWrapper)
        return wrapper(f)  # type: ignore[no-any-return]


def _cache(replay: bool) -> Callable[..., bool] | None:
    """The engine's static cache, emptied (each worker decides again, a reload's too; off when
    not replaying), or None when not replaying."""
    try:
        from refork import _native
    except ImportError:  # not built: no engine to replay
        return None
    _native.static_cache_reset(replay)
    return _native.static_cache_remember if replay else None


class _Span:
    """`count` bytes of a file from `offset`, in blocks: a range's body (WSGI)."""

    def __init__(self, f: IO[bytes], offset: int, count: int) -> None:
        self.file, self.left = f, count
        f.seek(offset)

    def __iter__(self) -> Iterator[bytes]:
        while self.left > 0:
            block = self.file.read(min(self.left, 1 << 16))
            if not block:
                return
            self.left -= len(block)
            yield block

    def close(self) -> None:
        self.file.close()


class StaticAsgi:
    """An ASGI app: the mounts' http requests answered here, everything else passed to the app."""

    def __init__(self, app: Any, files: StaticFiles, count: Count) -> None:
        self.app = app
        self.files = files
        self.count = count
        self.prefixes = tuple(m.prefix for m in files.mounts)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)  # type: ignore[no-any-return]
        path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        root = scope.get("root_path", "").encode("utf-8")
        if root and path.startswith(root):
            path = path[len(root) :]
        if not path.startswith(self.prefixes):
            return await self.app(scope, receive, send)  # type: ignore[no-any-return]
        wanted = ("if-none-match", "if-modified-since", "range", "if-range", "accept-encoding")
        headers = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            if key in wanted:
                headers[key] = value.decode("latin-1")
        answer = self.files.answer(scope["method"], path, headers)
        if answer is None:
            return await self.app(scope, receive, send)  # type: ignore[no-any-return]
        self.count(answer.status)
        try:
            head = _head(answer, bytes)
            await send({"type": "http.response.start", "status": answer.status, "headers": head})
            if answer.file is not None:
                await send({"type": "http.response.zerocopysend", "file": answer.file,
                            "offset": answer.offset, "count": answer.count})  # fmt: skip
            else:
                await send({"type": "http.response.body", "body": answer.body})
        finally:
            answer.close()


def _status_line(answer: Answer) -> str:
    return f"{answer.status} {_REASONS.get(answer.status, 'Unknown')}"


def _head(answer: Answer, kind: type) -> list[Any]:
    """The answer's header fields with its Content-Length, as `kind` (str for WSGI, bytes for ASGI)."""
    fields = list(answer.headers)
    if answer.status != 304:
        fields.append((b"content-length", b"%d" % answer.length))
    if kind is bytes:
        return fields
    return [(name.decode("latin-1"), value.decode("latin-1")) for name, value in fields]
