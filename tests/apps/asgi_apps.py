"""ASGI apps used by the ASGI loop tests and benchmarks.

``LIFESPAN_LOG`` (env): a file the lifespan-aware apps append "startup" / "shutdown" lines to.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The benchmark app: 13 bytes, Content-Length, no lifespan support (raises on it)."""
    assert scope["type"] == "http"
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", b"13")],
        }
    )
    await send({"type": "http.response.body", "body": b"Hello, world!"})


def _lifespan_log(line: str) -> None:
    path = os.environ.get("LIFESPAN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


async def _lifespan(receive: Any, send: Any, state: dict[str, Any]) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            state["started"] = "yes"
            _lifespan_log("startup")
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            _lifespan_log("shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Any) -> tuple[bytes, int]:
    parts = []
    messages = 0
    while True:
        message = await receive()
        assert message["type"] == "http.request", message
        messages += 1
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts), messages


async def _respond(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = list(headers or [])
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A small router exercising the server's corners (see the path names)."""
    if scope["type"] == "lifespan":
        await _lifespan(receive, send, scope["state"])
        return
    path = scope["path"]
    if path == "/echo":
        body, messages = await _read_body(receive)
        await _respond(send, 200, body, [(b"x-messages", str(messages).encode())])
    elif path == "/chunked":
        # Echo the body back streamed, without Content-Length: the server must chunk it.
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        while True:
            message = await receive()
            body = message.get("body", b"")
            if body:
                await send({"type": "http.response.body", "body": body, "more_body": True})
            if not message.get("more_body", False):
                break
        await send({"type": "http.response.body", "body": b"|end", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/scope":
        info = {k: scope[k] for k in ("http_version", "method", "scheme", "path", "root_path")}
        info["raw_path"] = scope["raw_path"].decode("latin-1")
        info["query_string"] = scope["query_string"].decode("latin-1")
        info["headers"] = [[n.decode("latin-1"), v.decode("latin-1")] for n, v in scope["headers"]]
        info["client"] = scope["client"]
        info["server"] = scope["server"]
        info["state"] = scope.get("state")
        await _respond(send, 200, json.dumps(info).encode(), [(b"content-type", b"application/json")])
    elif path == "/slow":
        delay = float(scope["query_string"].decode() or "1")
        _lifespan_log("slow")
        try:
            await asyncio.sleep(delay)
            await _respond(send, 200, b"slow done")
        finally:
            _lifespan_log("slow over")
    elif path == "/raise":
        raise RuntimeError("boom")
    elif path == "/noresponse":
        return
    elif path == "/raise-after-start":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"100")]})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("boom after start")
    elif path == "/bad-order":
        await send({"type": "http.response.body", "body": b"oops"})
    elif path == "/head-first":
        # The head must reach the client before the body is read: it only sends the body then.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        body, _ = await _read_body(receive)
        await send({"type": "http.response.body", "body": body})
    elif path == "/stream":
        count = int(scope["query_string"].decode() or "100")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        piece = b"y" * 65536
        for _ in range(count):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/wait-disconnect":
        # Waits for the client to go away (mid-body), then notes it in LIFESPAN_LOG.
        _lifespan_log("waiting for the disconnect")
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                _lifespan_log("disconnected")
                return
    elif path == "/big":
        size = int(scope["query_string"].decode() or "1000000")
        await _respond(send, 200, b"x" * size)
    else:
        await _respond(send, 200, f"{scope['method']} {path}".encode())


async def no_lifespan(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An app that does not implement lifespan: it raises on that scope."""
    if scope["type"] != "http":
        raise ValueError(f"unsupported scope {scope['type']}")
    await _respond(send, 200, b"no lifespan here")


async def failing_startup(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Lifespan startup reports failure: the worker must exit without serving."""
    if scope["type"] == "lifespan":
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "database unreachable"})
        return
    await _respond(send, 200, b"should never serve")
