"""Apps for the health, shutdown and systemd tests: a WSGI and an ASGI app whose /block holds the
worker's loop (time.sleep on the loop thread), so new connections wait in the listen backlog."""

import os
import time
from typing import Any


def wsgi(environ, start_response):
    path = environ["PATH_INFO"]
    if path == "/block":
        time.sleep(float(environ.get("QUERY_STRING") or "1"))
    body = f"{path} {os.getpid()}".encode()
    if path == "/env":  # what systemd passed must not reach the app
        passed = sorted(k for k in os.environ if k.startswith(("LISTEN_", "NOTIFY_", "WATCHDOG_")))
        body = " ".join(passed).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/block":
        time.sleep(float(scope["query_string"].decode() or "1"))  # blocks the event loop on purpose
    body = f"{path} {os.getpid()}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
