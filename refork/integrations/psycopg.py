"""psycopg 3, psycopg_pool and psycopg2: what the app opened at load is closed in the mold.

A pool is closed in the mold (its connections and its threads) and opened again in each worker,
where it connects on its own. A bare connection cannot be reopened for the app: it is closed, the
mold logs it with the fix, and the worker gets an error on first use instead of a shared stream.
"""

from __future__ import annotations

from typing import Any

from refork.integrations.base import Integration, each, log, run_coroutine

CONNECTIONS = ("psycopg:Connection", "psycopg:AsyncConnection", "psycopg2.extensions:connection")
POOLS = ("psycopg_pool:ConnectionPool", "psycopg_pool:NullConnectionPool", "psycopg_pool:AsyncConnectionPool",
         "psycopg2.pool:AbstractConnectionPool")  # fmt: skip
_reopen: list[Any] = []  # pools the mold closed: each worker opens them again


def _is_closed(conn: Any) -> bool:
    return bool(conn.closed)


def _pooled(conn: Any) -> bool:
    return getattr(conn, "_pool", None) is not None


def close_in_mold(objects: list[Any]) -> None:
    for obj in objects:
        try:
            if _is_pool3(obj):
                _close_pool3(obj)
            elif hasattr(obj, "closeall"):  # psycopg2.pool: close what it holds, keep it usable
                for conn in [*obj._pool, *obj._used.values()]:
                    conn.close()
                obj._pool, obj._used, obj._rused, obj._keys = [], {}, {}, 0
            elif not _is_closed(obj) and not _pooled(obj):
                log.warning(
                    "fork integrations: closed a %s connection opened at load; a worker using it gets "
                    "an error: open it per worker (refork.per_process(lambda: connect(...))) or use a pool",
                    type(obj).__module__.split(".")[0],
                )
                obj.pgconn.finish() if hasattr(obj, "pgconn") else obj.close()
        except Exception as e:
            log.warning("fork integrations: closing %r failed: %r", obj, e)


def _is_pool3(obj: Any) -> bool:
    return type(obj).__module__.startswith("psycopg_pool")


def _close_pool3(pool: Any) -> None:
    if pool.closed:
        return
    if type(pool).__name__.startswith("Async"):
        if not run_coroutine(pool.close):
            return
    else:
        pool.close()
    pool._opened = False  # it may be opened again (psycopg_pool refuses a closed pool otherwise)
    if pool not in _reopen:
        _reopen.append(pool)


def reopen_in_worker(objects: list[Any]) -> None:
    """Pools the mold closed open again here (async ones when the worker's loop runs: the app's job)."""
    sync = [pool for pool in _reopen if not type(pool).__name__.startswith("Async")]
    each(sync, "reopening psycopg pool", lambda pool: pool.open(wait=False))


def close_before_promotion(objects: list[Any]) -> None:
    """Idle pooled connections closed (the pool refills); threads are the pool's: mark, do not fork."""
    for obj in objects:
        if _is_pool3(obj) and not type(obj).__name__.startswith("Async") and not obj.closed:
            try:
                obj.check()  # keeps the pool open; drops broken connections
            except Exception as e:
                log.debug("fork integrations: %r check failed: %r", obj, e)


INTEGRATION = Integration(
    "psycopg",
    ("psycopg", "psycopg2", "psycopg_pool"),
    CONNECTIONS + POOLS,
    before_fork=close_in_mold,
    after_fork=reopen_in_worker,
    before_promotion=close_before_promotion,
)
