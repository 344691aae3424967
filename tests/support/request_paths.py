"""refork's request paths, for the tests that run one promise on each: id -> (the interface, the
flags that choose the path). The app modules these tests use have a `wsgi` and an `asgi` app.

A new request path is one more entry here: every test parametrized with `every_path` (the
promise matrix of test_promises.py, the access log, PROXY protocol, hooks, StatsD...) runs on it.
"""

from __future__ import annotations

import pytest

PATHS: dict[str, tuple[str, list[str]]] = {
    "python-1": ("wsgi", ["--wsgi-loop", "python", "--threads", "1"]),  # the Python WSGI loop
    "python-4": ("wsgi", ["--wsgi-loop", "python", "--threads", "4"]),  # ... with app threads
    "engine": ("wsgi", ["--wsgi-loop", "native", "--threads", "1"]),  # the native engine
    "pool": ("wsgi", ["--wsgi-loop", "native", "--threads", "4"]),  # the native pool engine
    "asyncio": ("asgi", ["--loop", "asyncio"]),
    "uvloop": ("asgi", ["--loop", "uvloop"]),
    # ASGI over HTTP/2 with prior knowledge (h2c): the tests' clients speak HTTP/2 on these
    "asyncio-h2c": ("asgi", ["--loop", "asyncio", "--http-protocols", "h2c,h1"]),
    "uvloop-h2c": ("asgi", ["--loop", "uvloop", "--http-protocols", "h2c,h1"]),
}
WSGI = [path for path, (interface, _) in PATHS.items() if interface == "wsgi"]

every_path = pytest.mark.parametrize("path", list(PATHS))
wsgi_paths = pytest.mark.parametrize("path", WSGI)


def over_http11_only(reason: str, interface: str | None = None) -> pytest.MarkDecorator:
    """The paths (of `interface`, or all) of a promise about HTTP/1.1 framing: the h2c cells are in
    the matrix, skipped with `reason` (what HTTP/2 has instead, and where that is tested)."""
    skip = pytest.mark.skip(reason=f"HTTP/1.1 only: {reason}")
    chosen = [p for p, (kind, _) in PATHS.items() if interface in (None, kind)]
    return pytest.mark.parametrize("path", [pytest.param(p, marks=skip) if http2(p) else p for p in chosen])


def http2(path: str) -> bool:
    """Whether the promise's clients speak HTTP/2 (h2c, prior knowledge) on this path."""
    chosen = PATHS[path][1]
    return "--http-protocols" in chosen and "h2c" in chosen[chosen.index("--http-protocols") + 1]


def threads(path: str) -> int:
    """The app threads of a worker on this path (0: ASGI, whose requests hold no thread)."""
    interface, flags = PATHS[path]
    return int(flags[flags.index("--threads") + 1]) if interface == "wsgi" else 0


def flags(path: str, module: str) -> tuple[list[str], str]:
    """(the flags, the app) that serve `module`'s app of this path's interface on this path."""
    interface, chosen = PATHS[path]
    extra = ["--interface", "asgi"] if interface == "asgi" else []
    return [*extra, *chosen], f"{module}:{interface}"
