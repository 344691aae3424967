"""Framework apps for benchmarks/asgi_frameworks.py: what ASGI users run, not a hello world.

- `fastapi_app`: FastAPI, GET /items/{item_id}?q=... answered with a pydantic model as JSON
  (path and query parsing, validation, serialisation: a typical JSON endpoint).
- `starlette_app`: Starlette, GET /stream answered with a StreamingResponse of 16 chunks of 1 KiB
  from an async generator (chunked transfer encoding, one send() a chunk).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route


class Item(BaseModel):
    item_id: int
    name: str
    price: float
    tags: list[str]
    q: str | None = None


fastapi_app = FastAPI()


@fastapi_app.get("/items/{item_id}")
async def read_item(item_id: int, q: str | None = None) -> Item:
    return Item(item_id=item_id, name=f"item {item_id}", price=item_id * 1.25, tags=["a", "b", "c"], q=q)


CHUNK = b"x" * 1023 + b"\n"


async def _chunks() -> AsyncIterator[bytes]:
    for _ in range(16):
        yield CHUNK


async def stream(request: Request) -> StreamingResponse:
    return StreamingResponse(_chunks(), media_type="text/plain")


starlette_app = Starlette(routes=[Route("/stream", stream)])
