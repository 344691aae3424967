"""One app, as WSGI (`wsgi`) and as ASGI (`asgi`), for the promise tests: every request path
serves the same URLs.

- `/`: "PID PPID" (which worker answered)
- `/sleep?S`: answers after S seconds in the app (WSGI: time.sleep; ASGI: an await)
- `/hang`: never answers (WSGI: a thread asleep for an hour; ASGI: an await that never returns)
- `/block?S`: holds the worker's only loop for S seconds (ASGI: time.sleep without await)
- `/big?N`: N bytes
- `/calls`: a call-heavy computation through classes, closures, generators, exceptions and
  containers of the preloaded heap, answered with a checksum that must never change (what an
  immortalized, frozen, specialized heap must keep computing right)
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from apps import heavy


def _route(path: str, query: str) -> tuple[str, bytes | float]:
    """(what to do, its argument) for a request."""
    if path == "/sleep":
        return "sleep", float(query or "1")
    if path == "/hang":
        return "sleep", 3600.0
    if path == "/block":
        return "block", float(query or "1")
    if path == "/big":
        return "body", b"x" * int(query or "1000000")
    if path == "/calls":
        return "body", str(heavy.checksum()).encode()
    return "body", f"{os.getpid()} {os.getppid()}".encode()


def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    action, arg = _route(environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
    if action != "body":
        time.sleep(arg)  # type: ignore[arg-type]
        arg = b"slept"
    body = arg if isinstance(arg, bytes) else b""
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    action, arg = _route(scope["path"], scope["query_string"].decode())
    if action == "sleep":
        await asyncio.sleep(arg)  # type: ignore[arg-type]
        arg = b"slept"
    elif action == "block":
        time.sleep(arg)  # type: ignore[arg-type]
        arg = b"slept"
    body = arg if isinstance(arg, bytes) else b""
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
