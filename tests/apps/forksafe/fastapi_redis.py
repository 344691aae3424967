"""A FastAPI app with redis.asyncio and an httpx.AsyncClient, both used while it loads.

The health checks at import run on a throw-away event loop (`asyncio.run`), leaving a pooled
Redis connection and a keep-alive HTTP connection behind in the loaded app, as a module-level
check in a real app does. Each request answers with the Redis CLIENT ID of the connection that
served it and the local port of the upstream connection httpx used (and those of the import).
"""

import asyncio
import os

import httpx
import redis.asyncio
from fastapi import FastAPI

cache = redis.asyncio.Redis.from_url(os.environ["REFORK_PROOF_REDIS_URL"], client_name="refork-proof-fastapi")
upstream = httpx.AsyncClient(base_url=os.environ["REFORK_PROOF_UPSTREAM_URL"], timeout=10)


async def upstream_port() -> int:
    """The local port of the connection httpx used, as the upstream saw it."""
    response = await upstream.get("/")  # connects at import
    response.raise_for_status()
    return response.json()["client_port"]


async def health_check() -> tuple[int, int]:
    return await cache.client_id(), await upstream_port()  # connects at import


IMPORT_BACKEND, IMPORT_UPSTREAM_PORT = asyncio.run(health_check())  # connects at import

app = FastAPI()


@app.get("/")
async def identity() -> dict[str, int]:
    return {
        "worker_pid": os.getpid(),
        "backend": await cache.client_id(),
        "import_backend": IMPORT_BACKEND,
        "upstream_port": await upstream_port(),
        "import_upstream_port": IMPORT_UPSTREAM_PORT,
    }
