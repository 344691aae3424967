"""HTTP client pools (urllib3 / requests Session, httpx Client / AsyncClient): no keep-alive crosses a fork.

The clients stay usable: only their pooled connections are dropped (closed in the mold, forgotten
in a worker, where descriptor hygiene has already cut the copies).
"""

from __future__ import annotations

from typing import Any

from refork.integrations.base import Integration, each, shut_down

_forgotten: list[Any] = []  # connection objects a fork copied: kept, never finalized here


def _pools(client: Any) -> list[Any]:
    """httpcore pools of an httpx client (its transport and its mounts)."""
    transports = [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]
    return [t._pool for t in transports if t is not None and hasattr(t, "_pool")]


def _drop_httpcore(pool: Any, close: bool) -> None:
    connections = list(getattr(pool, "_connections", ()))
    if not connections:
        return
    pool._connections = []
    for conn in connections:
        if close and not type(pool).__name__.startswith("Async"):
            conn.close()
            continue
        if close:  # an async connection, in the mold: its loop is gone
            stream = getattr(getattr(conn, "_connection", None), "_network_stream", None)
            shut_down(stream.get_extra_info("socket") if stream is not None else None)
        _forgotten.append(conn)


def _drop(obj: Any, close: bool) -> None:
    adapters = getattr(obj, "adapters", None)
    if adapters is not None:  # a requests Session: HTTPAdapter.close() clears its pool managers
        for adapter in adapters.values():
            adapter.close()
    elif hasattr(obj, "clear") and hasattr(obj, "connection_from_host"):  # a urllib3 PoolManager
        obj.clear()
    else:
        for pool in _pools(obj):
            _drop_httpcore(pool, close)


def close(objects: list[Any]) -> None:
    each(objects, "dropping the pooled connections of", lambda obj: _drop(obj, True))


def forget(objects: list[Any]) -> None:
    each(objects, "dropping the pooled connections of", lambda obj: _drop(obj, False))


INTEGRATION = Integration(
    "http",
    ("requests", "urllib3", "httpx"),
    ("requests.sessions:Session", "urllib3.poolmanager:PoolManager", "httpx:Client", "httpx:AsyncClient"),
    before_fork=close,
    after_fork=forget,
    before_promotion=close,
)
