"""Hello-world WSGI app for benchmarks/hello.py."""

from collections.abc import Callable, Iterable

BODY = b"Hello, world!"
HEADERS = [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))]


def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
    start_response("200 OK", HEADERS)
    return [BODY]
