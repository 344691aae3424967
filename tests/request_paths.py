"""refork's request paths, for the tests that run one promise on each: id -> (the interface, the
flags that choose the path). The app modules these tests use have a `wsgi` and an `asgi` app."""

from __future__ import annotations

PATHS: dict[str, tuple[str, list[str]]] = {
    "python-1": ("wsgi", ["--wsgi-loop", "python", "--threads", "1"]),  # the Python WSGI loop
    "python-4": ("wsgi", ["--wsgi-loop", "python", "--threads", "4"]),  # ... with app threads
    "engine": ("wsgi", ["--wsgi-loop", "native", "--threads", "1"]),  # the native engine
    "pool": ("wsgi", ["--wsgi-loop", "native", "--threads", "4"]),  # the native pool engine
    "asyncio": ("asgi", ["--loop", "asyncio"]),
    "uvloop": ("asgi", ["--loop", "uvloop"]),
}
