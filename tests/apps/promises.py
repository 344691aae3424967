"""One app, as WSGI (`wsgi`) and as ASGI (`asgi`), for the promise tests: every request path
serves the same URLs.

- `/`: "PID PPID" (which worker answered)
- `/sleep?S`: answers after S seconds in the app (WSGI: time.sleep; ASGI: an await)
- `/hang`: never answers (WSGI: a thread asleep for an hour; ASGI: an await that never returns)
- `/block?S`: holds the worker's only loop for S seconds (ASGI: time.sleep without await)
- `/started?S`: sends its head and half of its body, then holds the app thread (ASGI: the loop)
  for S seconds
- `/big?N`: N bytes
- `/status?N`: status N (any, even one no final response may have)
- `/upload`: the length of the request body, read whole
- ASGI only: a WebSocket on any path (`?S`: it sleeps S seconds before each receive());
  `/trickle?S`: reads the request body, sleeping S seconds before each receive(), and never
  answers (it returns when the client is gone); `/counts`: "MESSAGES DISCONNECTS BODY", what this
  worker's WebSockets received and the body bytes `/trickle` read
- `/calls`: a call-heavy computation through classes, closures, generators, exceptions and
  containers of the preloaded heap, answered with a checksum that must never change (what an
  immortalized, frozen, specialized heap must keep computing right)
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable
from typing import Any

from apps import heavy

COUNTS = {"received": 0, "closed": 0, "body": 0}


def _route(path: str, query: str) -> tuple[str, bytes | float]:
    """(what to do, its argument) for a request."""
    if path == "/sleep":
        return "sleep", float(query or "1")
    if path == "/hang":
        return "sleep", 3600.0
    if path == "/block":
        return "block", float(query or "1")
    if path == "/started":
        return "started", float(query or "1")
    if path == "/big":
        return "body", b"x" * int(query or "1000000")
    if path == "/status":
        return "status", float(query or "200")
    if path == "/upload":
        return "upload", b""
    if path == "/calls":
        return "body", str(heavy.checksum()).encode()
    return "body", f"{os.getpid()} {os.getppid()}".encode()


def wsgi(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    action, arg = _route(environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
    if action == "started":  # write(): sent at once on every path (a body's first items may be held)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "8")])(b"half")
        time.sleep(arg)  # type: ignore[arg-type]
        return [b"rest"]
    if action == "upload":
        arg = str(len(environ["wsgi.input"].read())).encode()
    elif action == "status":
        start_response(f"{arg:.0f} Status", [("Content-Type", "text/plain"), ("Content-Length", "0")])
        return []
    elif action in ("sleep", "block"):
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
    if scope["type"] == "websocket":
        await websocket(scope, receive, send)
        return
    action, arg = _route(scope["path"], scope["query_string"].decode())
    if scope["path"] == "/counts":
        action, arg = "body", "{received} {closed} {body}".format(**COUNTS).encode()
    elif scope["path"] == "/trickle":
        pause = float(scope["query_string"] or 0)
        more = True
        while more:
            await asyncio.sleep(pause)
            message = await receive()
            COUNTS["body"] += len(message.get("body", b""))
            more = message.get("more_body", False)
            del message  # (not held through the next nap)
        while (await receive())["type"] != "http.disconnect":
            pass
        return
    if action == "upload":
        size, more = 0, True
        while more:
            message = await receive()
            size += len(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
        arg = str(size).encode()
    elif action == "started":
        headers = [(b"content-type", b"text/plain"), (b"content-length", b"8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"half", "more_body": True})
        time.sleep(arg)  # type: ignore[arg-type]
        await send({"type": "http.response.body", "body": b"rest"})
        return
    elif action == "status":
        headers = [(b"content-length", b"0")]
        await send({"type": "http.response.start", "status": int(arg), "headers": headers})
        await send({"type": "http.response.body", "body": b""})
        return
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


async def websocket(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Accept, then receive every message (after a nap of ?S seconds each) until the disconnect."""
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    pause = float(scope["query_string"] or 0)
    while True:
        if pause:
            await asyncio.sleep(pause)
        message = await receive()
        if message["type"] == "websocket.disconnect":
            COUNTS["closed"] += 1
            return
        COUNTS["received"] += 1
        del message  # (not held through the next nap)
