"""Django: database and cache connections closed before each fork and before a promotion.

Django reopens a connection on the next query, so CONN_MAX_AGE persistent connections work in the
workers: each opens its own and keeps it.
"""

from __future__ import annotations

import sys
from typing import Any

from refork.integrations.base import Integration, log


def close_connections(objects: list[Any]) -> None:
    settings = getattr(sys.modules.get("django.conf"), "settings", None)
    if settings is None or not settings.configured:
        return
    db = sys.modules.get("django.db")
    if db is not None:
        try:
            db.connections.close_all()
        except Exception as e:
            log.warning("fork integrations: django connections.close_all() failed: %r", e)
    cache = sys.modules.get("django.core.cache")
    if cache is not None:
        try:
            for client in cache.caches.all(initialized_only=True):
                client.close()
        except Exception as e:
            log.warning("fork integrations: closing django caches failed: %r", e)


INTEGRATION = Integration(
    "django", ("django.db",), before_fork=close_connections, before_promotion=close_connections
)
