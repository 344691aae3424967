"""SQLAlchemy 1.4 / 2.x: no pooled connection crosses a fork (the documented recipe).

The mold closes its engines' pooled connections (`dispose()`); each worker starts with fresh
pools (`dispose(close=False)`: never touching the parent's connections); a worker about to be
promoted closes its own, which both processes reopen lazily.
"""

from __future__ import annotations

from typing import Any

from refork.integrations.base import Integration, each, run_coroutine


def _engines(objects: list[Any]) -> tuple[list[Any], list[Any]]:
    """(sync engines, async engines); an AsyncEngine's sync_engine is listed as sync too."""
    sync, aio = [], []
    for obj in objects:
        inner = getattr(obj, "sync_engine", None)
        if inner is not None:
            aio.append(obj)
        elif obj not in sync:
            sync.append(obj)
    return sync, aio


def close_pools(objects: list[Any]) -> None:
    sync, aio = _engines(objects)
    each(sync, "engine.dispose() of", lambda engine: engine.dispose())
    for engine in aio:
        if not run_coroutine(engine.dispose):  # asyncpg & co. close only on a loop
            engine.sync_engine.dispose(close=False)


def fresh_pools(objects: list[Any]) -> None:
    sync, aio = _engines(objects)
    each([*sync, *(e.sync_engine for e in aio)], "engine.dispose(close=False) of", _forget)


def _forget(engine: Any) -> None:
    engine.dispose(close=False)


def close_before_promotion(objects: list[Any]) -> None:
    sync, _ = _engines(objects)  # async pools live on the worker's loop: the new mold forgets them
    each(sync, "engine.dispose() of", lambda engine: engine.dispose())


INTEGRATION = Integration(
    "sqlalchemy",
    ("sqlalchemy",),
    ("sqlalchemy.engine:Engine", "sqlalchemy.ext.asyncio:AsyncEngine"),
    before_fork=close_pools,
    after_fork=fresh_pools,
    before_promotion=close_before_promotion,
)
