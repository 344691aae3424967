"""A FastAPI app with redis.asyncio and an httpx.AsyncClient, both used while it loads.

The health checks at import run on a throw-away event loop (`asyncio.run`), leaving a pooled
Redis connection and a keep-alive HTTP connection behind in the loaded app, as a module-level
check in a real app does. Each request answers with the Redis CLIENT ID of the connection that
served it and the local port of the upstream connection httpx used.
"""

import asyncio
import os

import httpx
import redis.asyncio
from fastapi import FastAPI

REDIS_URL = os.environ["REFORK_PROOF_REDIS_URL"]
UPSTREAM_URL = os.environ["REFORK_PROOF_UPSTREAM_URL"]

cache = redis.asyncio.Redis.from_url(REDIS_URL, client_name="refork-proof-fastapi")
upstream = httpx.AsyncClient(base_url=UPSTREAM_URL, timeout=10)


async def health_check() -> None:
    await cache.ping()  # connects at import
    (await upstream.get("/", headers={"x-proof": "import"})).raise_for_status()  # connects at import


asyncio.run(health_check())  # connects at import

app = FastAPI()


@app.get("/")
async def identity() -> dict[str, int]:
    client_id = await cache.client_id()
    answer = (await upstream.get("/")).json()
    return {"worker_pid": os.getpid(), "backend": client_id, "upstream_port": answer["client_port"]}
