"""redis-py, sync and asyncio: pools disconnected before a fork, and each worker starts its own.

The mold disconnects every pool (the pool stays usable and reconnects on the next command); a
new worker resets its pools so that none of the mold's connection objects is ever used there.
"""

from __future__ import annotations

from typing import Any

from refork.integrations.base import Integration, each, run_coroutine, shut_down


def _is_async(pool: Any) -> bool:
    return type(pool).__module__.startswith("redis.asyncio")


def disconnect(objects: list[Any]) -> None:
    for pool in objects:
        if _is_async(pool):
            # Its streams may be bound to a finished loop (the warm-up's): end them first.
            for conn in [*pool._available_connections, *pool._in_use_connections]:
                writer = getattr(conn, "_writer", None)
                shut_down(writer.get_extra_info("socket") if writer is not None else None)
            if not run_coroutine(pool.disconnect):
                pool.reset()
        else:
            each([pool], "redis pool disconnect() of", lambda p: p.disconnect())


def reset(objects: list[Any]) -> None:
    each(objects, "redis pool reset() of", lambda pool: pool.reset())


def disconnect_sync(objects: list[Any]) -> None:
    each([p for p in objects if not _is_async(p)], "redis pool disconnect() of", lambda p: p.disconnect())


INTEGRATION = Integration(
    "redis",
    ("redis",),
    ("redis.connection:ConnectionPool", "redis.asyncio.connection:ConnectionPool"),
    before_fork=disconnect,
    after_fork=reset,
    before_promotion=disconnect_sync,
)
