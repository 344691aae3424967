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
from typing import Protocol

from refork.http.events import ParseError

__all__ = ["CHURN_TRIM", "Charged", "MemoryBudget", "TRIM_AFTER", "charge_parser"]

# A flood that held this much, or passed this much through the buffers, and then let go is worth a
# malloc_trim() (see MemoryBudget.ebbed): glibc keeps freed heap memory that is not at the top of
# its heap, and many buffers freed amid live ones leave it scattered there.
TRIM_AFTER = 8 << 20
CHURN_TRIM = 4 << 20


class MemoryBudget:
    """Bytes held for a worker's apps, capped at ``limit`` (0: no cap)."""

    __slots__ = ("limit", "used", "peak", "churn", "on_full", "_waiting", "_waking")

    def __init__(self, limit: int) -> None:
        self.limit = limit or 1 << 62
        self.used = 0
        self.peak = 0  # the most held since the last ebb (see ebbed())
        self.churn = 0  # bytes charged or noted since the last ebb
        # called when a charge fills the budget: a loop that reads ahead of its checks (asyncio
        # reads a connection before telling it) stops its readers at once, not one read later each
        self.on_full: Callable[[], None] | None = None
        self._waiting: dict[object, tuple[Callable[[], None], int]] = {}  # in the order they came
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
        self.churn += n
        if used > self.peak:
            self.peak = used
        return True

    def charge(self, n: int) -> None:
        """Charge n bytes held already, whether they fit or not (the caller bounds the overshoot)."""
        before = self.used
        used = self.used = before + n
        self.churn += n
        if used > self.peak:
            self.peak = used
        if used >= self.limit > before and self.on_full is not None:
            self.on_full()

    def note(self, n: int) -> None:
        """n bytes went through a connection's buffers without being charged (refused at once)."""
        self.churn += n

    def give_back(self, n: int) -> None:
        """n bytes are no longer held: the connections waiting for room are called back, in the
        order they began to wait, while there is room."""
        self.used -= n
        if self._waiting and not self._waking:
            self._wake()

    def wait(self, key: object, callback: Callable[[], None], need: int = 0) -> None:
        """Call `callback` (once) when bytes are given back and there is room for `need` more
        (what the waiter may take at once, say a read); `key` names the waiter (a second wait by
        the same key keeps its place). Waiters are called in order, as many as the room allows."""
        self._waiting.setdefault(key, (callback, need))

    def cancel(self, key: object) -> None:
        self._waiting.pop(key, None)

    def nudge(self) -> None:
        """Wake waiters if there is room (once a second, from a loop's tick: a waiter woken for
        room it did not take, say it closed, must not leave the others waiting for a give_back
        that never comes)."""
        if self._waiting and not self._waking and self.used < self.limit:
            self._wake()

    def _wake(self) -> None:
        self._waking = True
        try:
            room = self.limit - self.used
            waiting = self._waiting
            while waiting and room > 0:
                key = next(iter(waiting))
                callback, need = waiting.pop(key)
                room -= need
                callback()
        finally:
            self._waking = False

    def ebbed(self) -> bool:
        """True (once) when the bytes held fell to a quarter of their peak after a flood (a peak of
        TRIM_AFTER, or CHURN_TRIM through the buffers, since the last time): the moment to give
        the freed memory back to the OS (malloc_trim)."""
        peak = self.peak
        if (peak < TRIM_AFTER and self.churn < CHURN_TRIM) or self.used * 4 > peak:
            return False
        self.peak = self.used
        self.churn = 0
        return True


class Charged(Protocol):
    """The worker's --max-request-memory as the loops hold it (Python's or the native one)."""

    def take(self, n: int) -> bool: ...
    def charge(self, n: int) -> None: ...
    def give_back(self, n: int) -> None: ...


def charge_parser(memory: Charged, before: int, now: int, head_held: int) -> ParseError | None:
    """A connection's parser holds `now` bytes where it held `before`: the difference charged or
    given back. A request head (`head_held`: its bytes, 0 when none) that does not fit is refused
    (503: the server is short of room now, not the request too big), with nothing charged; other
    bytes (kept for a replay) are charged all the same."""
    more = now - before
    if more > 0:
        if not memory.take(more):
            if head_held:
                return ParseError(503, "no room for more request heads (--max-request-memory)")
            memory.charge(more)
    elif more < 0:
        memory.give_back(-more)
    return None
