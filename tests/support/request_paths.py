"""refork's request paths, for the tests that run one promise on each: id -> (the interface, the
flags that choose the path). The app modules these tests use have a `wsgi` and an `asgi` app.

A new request path is one more entry here: every test parametrized with `every_path` (the
promise matrix of test_promises.py, the access log, PROXY protocol, hooks, StatsD...) runs on it.
Its server is started with `flags(path, module)` and its clients connect with `connect(path, port)`
(or, speaking HTTP/2 where `http2(path)`, an H2Client given `tls(path)`).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import socket
import ssl
import tempfile
from pathlib import Path

import pytest

from support.certs import Certs

PATHS: dict[str, tuple[str, list[str]]] = {
    "python-1": ("wsgi", ["--wsgi-loop", "python", "--threads", "1"]),  # the Python WSGI loop
    "python-4": ("wsgi", ["--wsgi-loop", "python", "--threads", "4"]),  # ... with app threads
    "engine": ("wsgi", ["--wsgi-loop", "native", "--threads", "1"]),  # the native engine
    "pool": ("wsgi", ["--wsgi-loop", "native", "--threads", "4"]),  # the native pool engine
    "asyncio": ("asgi", ["--loop", "asyncio"]),
    "uvloop": ("asgi", ["--loop", "uvloop"]),
    # HTTP/2 with prior knowledge (h2c): the tests' clients speak HTTP/2 on these
    "python-4-h2c": ("wsgi", ["--wsgi-loop", "python", "--threads", "4", "--http-protocols", "h2c,h1"]),
    # the native engine hands h2c to the Python loop, whose one app thread is the loop's
    "engine-h2c": ("wsgi", ["--wsgi-loop", "native", "--threads", "1", "--http-protocols", "h2c,h1"]),
    # ... and the pool engine to the Python loop, whose streams run on the engine's app threads
    "pool-h2c": ("wsgi", ["--wsgi-loop", "native", "--threads", "4", "--http-protocols", "h2c,h1"]),
    "asyncio-h2c": ("asgi", ["--loop", "asyncio", "--http-protocols", "h2c,h1"]),
    "uvloop-h2c": ("asgi", ["--loop", "uvloop", "--http-protocols", "h2c,h1"]),
    # HTTP/2 over TLS, chosen by ALPN (h2 is offered on a TLS listener by default)
    "engine-h2": ("wsgi", ["--wsgi-loop", "native", "--threads", "1"]),  # (TLS listeners: the Python loop)
    "uvloop-h2": ("asgi", ["--loop", "uvloop"]),
}
OVER_TLS = {"uvloop-h2", "engine-h2"}  # served with the session's certificates (flags() adds them)
WSGI = [path for path, (interface, _) in PATHS.items() if interface == "wsgi"]

every_path = pytest.mark.parametrize("path", list(PATHS))
wsgi_paths = pytest.mark.parametrize("path", WSGI)


def over_http11_only(reason: str, interface: str | None = None) -> pytest.MarkDecorator:
    """The paths (of `interface`, or all) of a promise about HTTP/1.1 framing: the HTTP/2 cells are
    in the matrix, skipped with `reason` (what HTTP/2 has instead, and where that is tested)."""
    skip = pytest.mark.skip(reason=f"HTTP/1.1 only: {reason}")
    chosen = [p for p, (kind, _) in PATHS.items() if interface in (None, kind)]
    return pytest.mark.parametrize("path", [pytest.param(p, marks=skip) if http2(p) else p for p in chosen])


def over_cleartext_only(reason: str) -> pytest.MarkDecorator:
    """Every path, those over TLS skipped with `reason` (what TLS changes about the promise)."""
    skip = pytest.mark.skip(reason=f"cleartext only: {reason}")
    return pytest.mark.parametrize("path", [pytest.param(p, marks=skip) if p in OVER_TLS else p
                                            for p in PATHS])  # fmt: skip


def http2(path: str) -> bool:
    """Whether the promise's clients speak HTTP/2 on this path (h2c prior knowledge, or ALPN h2)."""
    chosen = PATHS[path][1]
    h2c = "--http-protocols" in chosen and "h2c" in chosen[chosen.index("--http-protocols") + 1]
    return h2c or path in OVER_TLS


http2_paths = pytest.mark.parametrize("path", [path for path in PATHS if http2(path)])


def threads(path: str) -> int:
    """The app threads of a worker on this path (0: ASGI, whose requests hold no thread)."""
    interface, flags = PATHS[path]
    return int(flags[flags.index("--threads") + 1]) if interface == "wsgi" else 0


@functools.cache
def path_certs() -> Certs:
    """The TLS paths' CA and server certificate, made once per test process."""
    where = Path(tempfile.mkdtemp(prefix="refork-path-certs-"))
    atexit.register(shutil.rmtree, where, ignore_errors=True)
    return Certs(where)


def flags(path: str, module: str) -> tuple[list[str], str]:
    """(the flags, the app) that serve `module`'s app of this path's interface on this path."""
    interface, chosen = PATHS[path]
    extra = ["--interface", "asgi"] if interface == "asgi" else []
    return [*extra, *chosen, *(path_certs().args() if path in OVER_TLS else [])], f"{module}:{interface}"


def tls(path: str, alpn: str = "h2") -> ssl.SSLContext | None:
    """A client's TLS context for this path's listener, offering `alpn`; None: the path is cleartext."""
    return path_certs().client_context((alpn,)) if path in OVER_TLS else None


def connect(path: str, port: int, timeout: float = 10.0, alpn: str = "http/1.1") -> socket.socket:
    """A connection to this path's listener (over TLS on a TLS path, offering `alpn`), handshake done."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    context = tls(path, alpn)
    return context.wrap_socket(sock, server_hostname="127.0.0.1") if context else sock
