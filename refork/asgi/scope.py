"""The ASGI ``http`` scope of one request (sans-IO): a request event in, a scope dict out."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

from refork.http.events import Request
from refork.http.forwarded import TrustedProxies, forwarded_by_trusted

try:
    from refork import _native  # typed by refork/_native.pyi
except ImportError:  # not built: build_scope alone
    _native = None  # type: ignore[assignment]

ASGI_INFO = {"version": "3.0", "spec_version": "2.4"}

# The ASGI extensions of every http scope (see docs/asgi.md); a fresh dict per scope. Early hints
# are not offered to an HTTP/1.0 request: no 1xx may go to it (RFC 9110 15.2).
HTTP_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopysend", "http.response.trailers",
                   "http.response.early_hint")  # fmt: skip


def request_state(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """What a request (http or websocket) scope gets as ``state``: a shallow copy of the lifespan's.

    The copy keeps one request from leaking attributes into the next (ASGI lifespan spec, which
    Starlette's ``request.state`` relies on); the objects in it are shared.
    """
    return None if state is None else state.copy()


def decode_path(raw: bytes) -> str:
    """Percent-decode a raw path as UTF-8; undecodable bytes become U+FFFD, never an error."""
    if b"%" in raw:
        raw = unquote_to_bytes(raw)
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace")


def _no_native_scope(
    request: Request, *, server: tuple[str, int | None] | None, client: tuple[str, int] | None, scheme: str,
    root_path: str, state: dict[str, Any] | None, proxies: TrustedProxies | None,
) -> dict[str, Any] | None:  # fmt: skip
    return None


# http_scope(request, *, server, client, scheme, root_path, state, proxies): the scope build_scope
# makes, built in one call (refork._native, held to build_scope by tests/asgi/test_native_scope.py);
# None where build_scope must: a path to percent-decode or beyond ASCII, X-Forwarded-* fields
# from a trusted peer. The loop calls it first.
http_scope = _no_native_scope if _native is None else _native.http_scope


def build_scope(
    request: Request,
    *,
    server: tuple[str, int | None] | None,
    client: tuple[str, int] | None,
    scheme: str = "http",
    root_path: str = "",
    proxies: TrustedProxies | None = None,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``http`` scope for one request.

    X-Forwarded-Proto/-For are applied only when ``proxies`` is given: the connection gives it when
    they trust its peer. ``root_path`` is prepended to ``path``/``raw_path`` unless the request
    path already carries it (a proxy that does not strip the mount point), which is what current
    ASGI routers expect. ``state`` is shallow-copied so one request cannot leak attributes into
    the next. (A plain ASCII path is decoded here: decode_path's common case without the call.)
    """
    raw_path = request.path
    if proxies is not None:
        peer = client[0] if client else None
        new_scheme, host = forwarded_by_trusted(request.headers, peer, scheme, proxies)
        if host != peer or new_scheme != scheme:
            scheme = new_scheme
            if host is not None:
                port = client[1] if client and host == peer else 0
                client = (host, port)
    path = raw_path.decode("ascii") if raw_path.isascii() and b"%" not in raw_path else decode_path(raw_path)
    if root_path and not path.startswith(root_path):
        path = root_path + path
        raw_path = root_path.encode("utf-8") + raw_path
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": ASGI_INFO.copy(),  # each its own: an app may write to its scope
        "http_version": request.http_version,
        "server": server,
        "client": client,
        "scheme": scheme,
        "method": request.method,
        "root_path": root_path,
        "path": path,
        "raw_path": raw_path,
        "query_string": request.query,
        "headers": request.headers,
        "extensions": {  # HTTP_EXTENSIONS, spelled out: a literal is built faster
            "http.response.pathsend": {}, "http.response.zerocopysend": {}, "http.response.trailers": {},
            "http.response.early_hint": {},
        },  # fmt: skip
    }
    if request.http_version == "1.0":
        del scope["extensions"]["http.response.early_hint"]
    if state is not None:
        scope["state"] = state.copy()
    return scope
