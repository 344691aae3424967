"""Warm-up of an ASGI app: in the mold, before forking, without a socket."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from refork.asgi.response import ResponseState
from refork.asgi.scope import build_scope
from refork.config import Config
from refork.http.events import Request

log = logging.getLogger("refork")


def warmup_asgi(app: Any, requests: list[Request], config: Config) -> list[int]:
    """Run each request through the app, without a socket, on a throwaway event loop.

    Runs in the mold before it forks: the loop is plain asyncio (no uvloop state to inherit) and
    is closed completely, default executor included, so no thread survives. Lifespan is not run
    (its resources must be opened in each worker). Returns the statuses; 500 if the app raised.
    """
    loop = asyncio.new_event_loop()
    try:
        statuses = [loop.run_until_complete(_warm_one(app, request, config)) for request in requests]
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
    return statuses


async def _warm_one(app: Any, request: Request, config: Config) -> int:
    scope = build_scope(
        request, server=("localhost", 80), client=("127.0.0.1", 0), root_path=config.root_path, state={}
    )
    del scope["extensions"]  # no socket to send a file or trailers to: the app falls back to body
    response = ResponseState(request, keep_alive=False)
    sent_request = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        response.feed(message)

    try:
        await app(scope, receive, send)
    except Exception:
        log.warning("warm-up request %s raised", request.target.decode("utf-8", "replace"), exc_info=True)
        return 500
    return response.status if response.complete else 500
