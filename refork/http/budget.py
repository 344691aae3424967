"""What a worker's connections hold in memory for their apps, against one limit per worker.

A connection bounds what it buffers itself (a line, a head, a body backlog, a message queue); a
:class:`MemoryBudget` bounds the sum over all of a worker's connections, so many connections
cannot add up to an out-of-memory kill. The loops charge bytes as they buffer them and give them
back as their app takes them (or the connection ends); what a loop does when the budget is full is
its own: refuse (503, 1009), spill to disk, or stop reading the connection until bytes are given
back (``wait``). Sans-IO: no clock, no socket.

refork._native has the same interface (``MemoryBudget``), shared with the native engines' threads.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MemoryBudget", "TRIM_AFTER"]

# A flood that held this much and then let go is worth a malloc_trim() (see MemoryBudget.ebbed):
# glibc keeps freed heap memory that is not at the top of its heap.
TRIM_AFTER = 8 << 20


class MemoryBudget:
    """Bytes held for a worker's apps, capped at ``limit`` (0: no cap)."""

    __slots__ = ("limit", "used", "peak", "_waiting", "_waking")

    def __init__(self, limit: int) -> None:
        self.limit = limit or 1 << 62
        self.used = 0
        self.peak = 0  # the most held since the last ebb (see ebbed())
        self._waiting: dict[object, Callable[[], None]] = {}  # in the order they came
        self._waking = False

    @property
    def left(self) -> int:
        return self.limit - self.used

    @property
    def full(self) -> bool:
        return self.used >= self.limit

    def take(self, n: int) -> bool:
        """Charge n bytes if they fit; False, with nothing charged, when they do not."""
        used = self.used + n
        if used > self.limit:
            return False
        self.used = used
        if used > self.peak:
            self.peak = used
        return True

    def charge(self, n: int) -> None:
        """Charge n bytes held already, whether they fit or not (the caller bounds the overshoot)."""
        used = self.used = self.used + n
        if used > self.peak:
            self.peak = used

    def give_back(self, n: int) -> None:
        """n bytes are no longer held: the connections waiting for room are called back, in the
        order they began to wait, while there is room."""
        self.used -= n
        if self._waiting and not self._waking:
            self._wake()

    def wait(self, key: object, callback: Callable[[], None]) -> None:
        """Call `callback` (once) when bytes are given back and there is room; `key` names the
        waiter (a second wait by the same key keeps its place)."""
        self._waiting.setdefault(key, callback)

    def cancel(self, key: object) -> None:
        self._waiting.pop(key, None)

    def _wake(self) -> None:
        self._waking = True
        try:
            while self._waiting and self.used < self.limit:
                key = next(iter(self._waiting))
                self._waiting.pop(key)()
        finally:
            self._waking = False

    def ebbed(self) -> bool:
        """True (once) when the bytes held fell to a quarter of a peak of at least TRIM_AFTER since
        the last time: the moment to give the freed memory back to the OS (malloc_trim)."""
        peak = self.peak
        if peak < TRIM_AFTER or self.used * 4 > peak:
            return False
        self.peak = self.used
        return True
