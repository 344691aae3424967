"""psycopg 3, psycopg_pool and psycopg2: what the app opened at load is closed in the mold.

A pool is closed in the mold (its connections and its threads) and opened again in each worker,
where it connects on its own. A bare connection cannot be reopened for the app: it is closed, the
mold logs it with the fix, and the worker gets an error on first use instead of a shared stream.
"""

from __future__ import annotations

import threading
from typing import Any

from refork.integrations.base import Integration, each, log, run_coroutine

CONNECTIONS = ("psycopg:Connection", "psycopg:AsyncConnection", "psycopg2.extensions:connection")
POOLS = ("psycopg_pool:ConnectionPool", "psycopg_pool:NullConnectionPool", "psycopg_pool:AsyncConnectionPool",
         "psycopg2.pool:AbstractConnectionPool")  # fmt: skip
_reopen: list[Any] = []  # pools the mold closed: each worker opens them again
_forgotten: list[Any] = []  # connections a fork copied: kept, never finalized here
_not_ours: set[int] = set()  # ids of a worker's bare connections, seen in the mold it became


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
            elif not _is_closed(obj) and not _pooled(obj) and id(obj) not in _not_ours:
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


def _inherit_pool3(pool: Any) -> None:
    """A psycopg_pool pool copied by a fork: forget the parent's connections and its (dead) threads.

    The pool is left closed-but-reopenable; its lock is new (a parent's thread may have held it).
    """
    if pool.closed:
        return
    _forgotten.extend(pool._pool)  # the parent's connections: never used, never finalized here
    pool._pool.clear()
    pool._waiting.clear()
    pool._workers, pool._sched_runner = [], None
    pool._nconns = pool.min_size
    pool._lock = threading.Lock()
    pool._closed, pool._opened = True, False
    if pool not in _reopen:
        _reopen.append(pool)


def _sync_pools(objects: list[Any]) -> list[Any]:
    return [obj for obj in objects if _is_pool3(obj) and not type(obj).__name__.startswith("Async")]


def forget_in_promoted_mold(objects: list[Any]) -> None:
    """The promoted mold runs no pool threads and closes none of the worker's connections.

    It forgets what the worker's pools held, and remembers the worker's bare connections as not
    its own (closing one would end the worker's session).
    """
    each(_sync_pools(objects), "forgetting the connections of", _inherit_pool3)
    _not_ours.update(id(obj) for obj in objects if not _is_pool3(obj) and not hasattr(obj, "closeall"))


def reopen_in_worker(objects: list[Any]) -> None:
    """Each worker opens its own pools: those the mold closed, and copies of a worker's (after a refork).

    Async pools are opened by the app on the worker's loop (`await pool.open()`, a lifespan hook).
    """
    each(_sync_pools(objects), "forgetting the connections of", _inherit_pool3)
    each(_sync_pools(_reopen), "reopening psycopg pool", lambda pool: pool.open(wait=False))


INTEGRATION = Integration(
    "psycopg",
    ("psycopg", "psycopg2", "psycopg_pool"),
    CONNECTIONS + POOLS,
    before_fork=close_in_mold,
    after_fork=reopen_in_worker,
    after_promotion=forget_in_promoted_mold,
)
