"""The server's readiness, shared: one MAP_SHARED page the monitor writes and workers read.

Allocated by the monitor before any fork (like the slots page), so a worker answering a health
check reads the server-wide state with one memory load and no message: whether the server is
ready (``--ready-when``) and whether it is draining (a TERM arrived: ``--shutdown-delay``, then the
stop), and how many app threads its workers have free (a worker with none free stops accepting
only while a sibling could serve the connection instead). Only the monitor writes it.
"""

from __future__ import annotations

import ctypes
import mmap

READY, DRAINING, FREE_THREADS = 0, 1, 2
# How long every app thread must read busy before the page says so: a sibling busy for a moment
# (a quick request on its last free thread) still counts as free.
ALL_BUSY_AFTER = 0.5  # seconds


class Readiness:
    def __init__(self) -> None:
        self._map = mmap.mmap(-1, mmap.PAGESIZE, mmap.MAP_SHARED)
        self._words = memoryview(self._map).cast("q")
        self._all_busy_since: float | None = None

    # the monitor's side
    def set_ready(self) -> None:
        self._words[READY] = 1

    def set_draining(self) -> None:
        self._words[DRAINING] = 1

    def set_free_threads(self, count: int, now: float) -> None:
        """App threads free in the server's thread-pool workers, as the monitor counted them at
        `now`. A count of 0 replaces a positive one only once every count for ALL_BUSY_AFTER was 0:
        a full worker starts accepting when no sibling can take the connection, and a sibling
        between two quick requests is not that (one read in the middle of a request would let the
        full worker take a connection it cannot start)."""
        if count == 0 and self._words[FREE_THREADS] > 0:
            if self._all_busy_since is None:
                self._all_busy_since = now
            if now - self._all_busy_since < ALL_BUSY_AFTER:
                return
        self._all_busy_since = None
        self._words[FREE_THREADS] = count

    # everyone's
    @property
    def ready(self) -> bool:
        return bool(self._words[READY])

    @property
    def draining(self) -> bool:
        return bool(self._words[DRAINING])

    @property
    def free_threads(self) -> int:
        return int(self._words[FREE_THREADS])

    def free_threads_address(self) -> int:
        """Where the native pool engine's I/O thread reads free_threads (without the GIL)."""
        self._pin = ctypes.c_char.from_buffer(self._map)  # the page stays mapped, and this alive
        return ctypes.addressof(self._pin) + FREE_THREADS * 8

    def health(self, kind: str) -> int:
        """The status a health check of `kind` gets: "live" 200; "ready" 200 or 503."""
        if kind == "ready":
            words = self._words
            return 200 if words[READY] and not words[DRAINING] else 503
        return 200
