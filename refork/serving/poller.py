"""The readiness poller of the WSGI loop.

``select.epoll`` (``select.poll`` elsewhere) directly rather than ``selectors``: the per-event
key objects of ``selectors`` are measurable at these request rates.
"""

from __future__ import annotations

import select
from typing import Any

IN, OUT = select.POLLIN, select.POLLOUT


class Poller:
    """epoll where available (seconds timeouts), poll elsewhere (milliseconds)."""

    def __init__(self) -> None:
        if hasattr(select, "epoll"):
            self._p: Any = select.epoll()
            self._scale = 1.0
        else:  # pragma: no cover - non-Linux
            self._p = select.poll()
            self._scale = 1000.0

    def fileno(self) -> int:
        """The epoll fd (readable when a registered fd is ready): the native engine watches it."""
        return int(self._p.fileno())

    def register(self, fd: int) -> None:
        self._p.register(fd, IN)

    def watch(self, fd: int, mask: int) -> None:
        """Change what a registered fd is polled for (IN or OUT)."""
        self._p.modify(fd, mask)

    def unregister(self, fd: int) -> None:
        try:
            self._p.unregister(fd)
        except (OSError, KeyError, ValueError):
            pass

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        events: list[tuple[int, int]] = self._p.poll(timeout * self._scale)
        return events

    def close(self) -> None:
        """Close without unregistering: after a fork the epoll instance is shared with the parent."""
        close = getattr(self._p, "close", None)
        if close is not None:
            close()
