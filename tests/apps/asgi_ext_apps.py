"""ASGI apps for tests/asgi/test_asgi_extensions.py: disconnects, file sends, trailers, lifespan state.

``EVENTS_LOG`` (env): a file the apps append one line per event to ("disconnect 1.02", ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route


def log_event(line: str) -> None:
    path = os.environ.get("EVENTS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


async def _start(send: Any, status: int, headers: list[tuple[bytes, bytes]] | None = None, **kw: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers or [], **kw})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    handler = ROUTES.get(scope["path"])
    if handler is None:
        await _start(send, 404)
        await send({"type": "http.response.body", "body": b"not found"})
        return
    await handler(scope, receive, send, query)


async def sse(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    """An event every 100 ms for 30 s; a side task awaits receive() (as Starlette's streaming did)."""
    began = time.monotonic()
    gone = asyncio.Event()

    async def watch() -> None:
        message = await receive()
        while message["type"] == "http.request" and message.get("more_body"):
            message = await receive()
        if message["type"] == "http.request":
            message = await receive()
        log_event(f"{message['type']} {time.monotonic() - began:.2f}")
        gone.set()

    watcher = asyncio.ensure_future(watch())
    await _start(send, 200, [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")])
    try:
        for n in range(300):
            if gone.is_set():
                break
            try:
                await send({"type": "http.response.body", "body": b"data: %d\n\n" % n, "more_body": True})
            except OSError as exc:  # the client went during the nap and send() ran before the watcher:
                log_event(f"late send raised {type(exc).__name__} {isinstance(exc, OSError)}")
                await asyncio.wait_for(gone.wait(), 10)  # (its receive() has the disconnect too)
                return
            await asyncio.sleep(0.1)
        else:
            await send({"type": "http.response.body", "body": b""})
            return
        try:  # the spec (2.4): send() after the disconnect raises an OSError
            await send({"type": "http.response.body", "body": b"data: late\n\n", "more_body": True})
            log_event("late send returned")
        except OSError as exc:
            log_event(f"late send raised {type(exc).__name__} {isinstance(exc, OSError)}")
    finally:
        watcher.cancel()
        log_event("sse task ended")


async def longpoll(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    """Only awaits receive(): after the (empty) body, the next message must be http.disconnect."""
    began = time.monotonic()
    message = await receive()
    assert message["type"] == "http.request"
    log_event("waiting")
    message = await receive()
    log_event(f"{message['type']} {time.monotonic() - began:.2f}")


async def pathsend(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    assert "http.response.pathsend" in scope["extensions"]
    headers = [(b"content-type", b"application/octet-stream")]
    if query.get("length") != "none":
        headers.append((b"content-length", str(os.stat(query["path"]).st_size).encode()))
    await _start(send, 200, headers)
    try:
        await send({"type": "http.response.pathsend", "path": query["path"]})
    except FileNotFoundError:
        log_event("pathsend FileNotFoundError")
        raise


async def zerocopy(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    """``parts``: "offset:count,..." sent as zerocopysend messages mixed with body ones."""
    assert "http.response.zerocopysend" in scope["extensions"]
    await _start(send, 200, [(b"content-type", b"application/octet-stream")])
    with open(query["path"], "rb") as f:
        for part in query["parts"].split(","):
            offset, count = part.split(":")
            message: dict[str, Any] = {"type": "http.response.zerocopysend", "file": f, "more_body": True}
            if offset:
                message["offset"] = int(offset)
            if count:
                message["count"] = int(count)
            await send(message)
            await send({"type": "http.response.body", "body": b"|", "more_body": True})
        log_event(f"position {f.tell()}")
    await send({"type": "http.response.body", "body": b"end"})


async def trailers(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    assert "http.response.trailers" in scope["extensions"]
    headers = [(b"content-type", b"text/plain"), (b"trailer", b"x-checksum, x-count")]
    if "length" in query:
        headers.append((b"content-length", b"11"))
    await _start(send, 200, headers, trailers=True)
    await send({"type": "http.response.body", "body": b"hello ", "more_body": True})
    await send({"type": "http.response.body", "body": b"world"})
    first = [(b"x-checksum", b"abc123")]
    await send({"type": "http.response.trailers", "headers": first, "more_trailers": True})
    await send({"type": "http.response.trailers", "headers": [(b"x-count", b"2"), (b"content-length", b"9")]})


ROUTES = {
    "/sse": sse, "/longpoll": longpoll, "/pathsend": pathsend, "/zerocopy": zerocopy, "/trailers": trailers,
}  # fmt: skip


# A Starlette app: lifespan state into request.state, FileResponse (pathsend), StreamingResponse.


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
    yield {"greeting": f"hello from lifespan in {os.getpid()}", "shared": []}


async def state_route(request: Request) -> PlainTextResponse:
    request.state.shared.append(1)  # the dict is a copy, the objects in it are shared
    request.state.mine = "per request"
    return PlainTextResponse(f"{request.state.greeting} {len(request.state.shared)}")


async def leak_route(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(hasattr(request.state, "mine")))


async def file_route(request: Request) -> FileResponse:
    return FileResponse(request.query_params["path"], media_type="application/octet-stream")


async def stream_route(request: Request) -> StreamingResponse:
    async def events() -> AsyncIterator[bytes]:
        try:
            for n in range(300):
                yield b"data: %d\n\n" % n
                await asyncio.sleep(0.1)
        finally:
            log_event("starlette stream closed")

    return StreamingResponse(events(), media_type="text/event-stream")


starlette_app = Starlette(
    routes=[
        Route("/state", state_route),
        Route("/leak", leak_route),
        Route("/file", file_route),
        Route("/stream", stream_route),
    ],
    lifespan=lifespan,
)
