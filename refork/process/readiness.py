"""The server's readiness, shared: one MAP_SHARED page the monitor writes and workers read.

Allocated by the monitor before any fork (like the slots page), so a worker answering a health
check reads the server-wide state with one memory load and no message: whether the server is
ready (``--ready-when``) and whether it is draining (a TERM arrived: ``--shutdown-delay``, then the
stop). Only the monitor writes it.
"""

from __future__ import annotations

import mmap

READY, DRAINING = 0, 1


class Readiness:
    def __init__(self) -> None:
        self._map = mmap.mmap(-1, mmap.PAGESIZE, mmap.MAP_SHARED)
        self._words = memoryview(self._map).cast("q")

    # the monitor's side
    def set_ready(self) -> None:
        self._words[READY] = 1

    def set_draining(self) -> None:
        self._words[DRAINING] = 1

    # everyone's
    @property
    def ready(self) -> bool:
        return bool(self._words[READY])

    @property
    def draining(self) -> bool:
        return bool(self._words[DRAINING])

    def health(self, kind: str) -> int:
        """The status a health check of `kind` gets: "live" 200; "ready" 200 or 503."""
        if kind == "ready":
            words = self._words
            return 200 if words[READY] and not words[DRAINING] else 503
        return 200
