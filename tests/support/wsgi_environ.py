"""A request and the environ the WSGI loops would build for it, for the tests that call the WSGI
layer directly (EnvironBuilder, run_wsgi) without a server."""

from __future__ import annotations

from refork.http.body import EMPTY_INPUT, InputStream
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies
from refork.wsgi import EnvironBuilder

PROXIES = TrustedProxies(["127.0.0.1"])


def req(target: bytes = b"/", method: str = "GET", headers=None, version: str = "1.1", **kw) -> Request:
    path, _, query = target.partition(b"?")
    if headers is None:
        headers = [(b"host", b"example.com")]
    return Request(method, target, path, query, version, headers, **kw)


def env(request: Request, body: InputStream | None = None, client=("127.0.0.1", 5555), **kw):
    kw.setdefault("server", ("0.0.0.0", 8000))
    kw.setdefault("proxies", PROXIES)
    return EnvironBuilder(url_scheme="http", **kw).build(request, body or EMPTY_INPUT, client)
