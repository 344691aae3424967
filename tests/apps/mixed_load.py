"""The app of the mixed load (tests/support/mixed_load.py), as WSGI (`wsgi`) and ASGI (`asgi`):

- `/`: "PID" (a keep-alive GET)
- `/upload`: the length of the request body, read whole
- `/stream?N`: N chunks of CHUNK bytes, PAUSE seconds apart (a slow streaming response)
- ASGI only: a WebSocket on any path that echoes every text message
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

CHUNK = b"s" * 1000
PAUSE = 0.1


def _chunks(query: str) -> int:
    return int(query or "10")


def wsgi(environ: dict[str, Any], start_response: Any) -> Any:
    path, query = environ["PATH_INFO"], environ.get("QUERY_STRING", "")
    if path == "/stream":
        n = _chunks(query)
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(n * len(CHUNK)))])
        return _stream(n)
    body = str(len(environ["wsgi.input"].read())).encode() if path == "/upload" else str(os.getpid()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def _stream(n: int) -> Iterator[bytes]:
    for i in range(n):
        if i:
            time.sleep(PAUSE)
        yield CHUNK


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].rpartition(".")[2]
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["type"] == "websocket":
        await _echo(receive, send)
        return
    if scope["path"] == "/stream":
        n = _chunks(scope["query_string"].decode())
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(n * len(CHUNK)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i in range(n):
            if i:
                await asyncio.sleep(PAUSE)
            await send({"type": "http.response.body", "body": CHUNK, "more_body": i < n - 1})
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False) and message["type"] == "http.request"
    body = str(size).encode() if scope["path"] == "/upload" else str(os.getpid()).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _echo(receive: Any, send: Any) -> None:
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": message.get("text")})
