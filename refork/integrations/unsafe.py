"""Clients that cannot be fixed from outside: a warning with the fix, said once in the mold."""

from __future__ import annotations

from typing import Any

from refork.integrations.base import Integration

FIXES = {
    "MongoClient": "pymongo's MongoClient is not fork-safe (threads, pooled sockets): create it in each "
    "worker, e.g. client = refork.per_process(lambda: MongoClient(...))",
}


def client_warnings(objects: list[Any]) -> list[str]:
    return [f"a {type(obj).__name__} exists at fork; {FIXES.get(type(obj).__name__, 'create it per worker')}"
            for obj in objects]  # fmt: skip


INTEGRATION = Integration(
    "unsafe", ("pymongo",), ("pymongo.mongo_client:MongoClient",), warnings=client_warnings
)
