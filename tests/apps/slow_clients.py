"""Streamed responses for the slow-client tests, WSGI and ASGI alike.

``/`` answers the worker's pid; ``/echo`` echoes the body; ``/big?N`` streams N bytes (default
50 MB) in 64 KiB items, produced as they are pulled; ``/file?N`` (WSGI) sends an N-byte file
through ``wsgi.file_wrapper``; ``/stuck`` starts a response and then hangs in the app (WSGI: in
the body iterable after 4 MB, so after the socket filled up; ASGI: awaiting a sleep).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

BIG = 50 << 20
CHUNK = 1 << 16


def _chunks(total: int) -> Iterator[bytes]:
    block = b"x" * CHUNK
    sent = 0
    while sent < total:
        piece = block if total - sent >= CHUNK else block[: total - sent]
        sent += len(piece)
        yield piece


def _stuck() -> Iterator[bytes]:
    yield from _chunks(4 << 20)
    time.sleep(60)  # app time: the worker's deadline must catch it
    yield b"never"


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
    path, query = environ["PATH_INFO"], environ["QUERY_STRING"]
    if path == "/stuck":
        start_response("200 OK", [])
        return _stuck()
    if path in ("/big", "/file"):
        total = int(query or BIG)
        start_response("200 OK", [("Content-Length", str(total))])
        if path == "/big":
            return _chunks(total)
        f = tempfile.TemporaryFile()  # noqa: SIM115 - the file_wrapper closes it
        f.truncate(total)
        return environ["wsgi.file_wrapper"](f)
    body = environ["wsgi.input"].read() if path == "/echo" else str(os.getpid()).encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/stuck":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await asyncio.sleep(60)  # app time, though the event loop is free
        return
    if path == "/big":
        total = int(scope["query_string"] or BIG)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(total).encode())]})  # fmt: skip
        for piece in _chunks(total):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    if path == "/echo":
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
    else:
        body = str(os.getpid()).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})
