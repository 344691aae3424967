"""A shared-memory page of per-worker slots: the monitor reads what workers write, no messages.

Allocated by the monitor before any fork (MAP_SHARED, anonymous), so every descendant writes the
same physical page. Each slot is one cache line: deadline (monotonic seconds, 0 = none), requests
served, and the pid that owns it (so a stale slot is never misread).
"""

from __future__ import annotations

import mmap

SLOT_WORDS = 8  # 64 bytes
DEADLINE, REQUESTS, PID = 0, 1, 2


class Slots:
    def __init__(self, capacity: int) -> None:
        self._map = mmap.mmap(-1, capacity * SLOT_WORDS * 8, mmap.MAP_SHARED)
        self._floats = memoryview(self._map).cast("d")
        self._ints = memoryview(self._map).cast("q")

    def claim(self, index: int, pid: int, deadline: float) -> None:
        base = index * SLOT_WORDS
        self._ints[base + PID] = pid
        self._ints[base + REQUESTS] = 0
        self._floats[base + DEADLINE] = deadline

    def set_deadline(self, index: int, deadline: float) -> None:
        self._floats[index * SLOT_WORDS + DEADLINE] = deadline

    def deadline(self, index: int) -> float:
        return self._floats[index * SLOT_WORDS + DEADLINE]

    def set_requests(self, index: int, count: int) -> None:
        self._ints[index * SLOT_WORDS + REQUESTS] = count

    def requests(self, index: int) -> int:
        return self._ints[index * SLOT_WORDS + REQUESTS]

    def owner(self, index: int) -> int:
        return self._ints[index * SLOT_WORDS + PID]

    def release(self, index: int) -> None:
        base = index * SLOT_WORDS
        self._ints[base + PID] = 0
        self._floats[base + DEADLINE] = 0.0


class SlotAllocator:
    """Hands out free slot indexes (monitor side)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))

    def take(self) -> int:
        if not self._free:
            raise RuntimeError("no free worker slots: too many workers for the shared page")
        return self._free.pop()

    def give_back(self, index: int) -> None:
        if index >= 0 and index not in self._free:
            self._free.append(index)
