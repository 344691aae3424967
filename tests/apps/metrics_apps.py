"""Apps for tests/process/test_metrics.py: answer with the status the path asks for, sleep, crash."""

import asyncio
import os
import time


def _what(path: str, query: str) -> tuple[int, float]:
    """/status/404 -> (404, 0); /sleep?0.5 -> (200, 0.5); anything else (200, 0)."""
    if path.startswith("/status/"):
        return int(path.rsplit("/", 1)[1]), 0.0
    if path == "/sleep":
        return 200, float(query or "1")
    return 200, 0.0


def app(environ, start_response):
    if environ["PATH_INFO"] == "/crash":
        os._exit(1)
    status, sleep = _what(environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
    if sleep:
        time.sleep(sleep)
    body = str(os.getpid()).encode()
    start_response(f"{status} X", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    status, sleep = _what(scope["path"], scope["query_string"].decode())
    if sleep:
        await asyncio.sleep(sleep)
    body = str(os.getpid()).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
