"""A shared-memory page of per-worker slots: the monitor reads what workers write, no messages.

Allocated by the monitor before any fork (MAP_SHARED, anonymous), so every descendant writes the
same physical page. Each slot is SLOT_WORDS 8-byte words (8 cache lines): deadline (monotonic
seconds, 0 = none), requests served, the pid that owns it (so a stale slot is never misread), and
the worker's metrics: requests in flight and in the app, its thread count, when it started,
requests past --request-timeout, the duration sum, responses by status class and one count per
histogram bucket (not cumulative: one increment per request). Only the worker writes its slot,
under its AppClock's lock; the monitor reads it lock-free, so a reading may be one request apart
between two words (the renderer derives a histogram's count from its own buckets).
"""

from __future__ import annotations

import bisect
import mmap
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

SLOT_WORDS = 64  # 512 bytes
DEADLINE, REQUESTS, PID = 0, 1, 2
IN_FLIGHT = 3  # requests between request_started and request_finished
BUSY = 4  # of those, requests in the app (holding a thread with --threads)
THREADS = 5  # the worker's app threads (--threads; 0 for ASGI, which has none)
STARTED = 6  # time.time() when the worker claimed the slot (float)
OVERDUE = 7  # requests past --request-timeout (written by the worker)
DURATION_SUM = 8  # seconds, float
STATUS = 9  # 5 words: responses 1xx .. 5xx
BUCKETS = 14  # one word per histogram bucket, then the +Inf overflow
MAX_BUCKETS = SLOT_WORDS - BUCKETS - 1  # 49 finite buckets at most
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
DEFAULT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # Prometheus' defaults


@dataclass(frozen=True)
class SlotCounters:
    """One worker's metric words as read at once by the monitor."""

    requests: int
    in_flight: int
    busy: int
    threads: int
    started: float
    overdue: int
    duration_sum: float
    statuses: tuple[int, ...]  # 1xx .. 5xx
    buckets: tuple[int, ...]  # per bucket (not cumulative), the last one +Inf


class Slots:
    def __init__(self, capacity: int, buckets: Sequence[float] = DEFAULT_BUCKETS) -> None:
        if len(buckets) > MAX_BUCKETS:
            raise ValueError(f"at most {MAX_BUCKETS} histogram buckets")
        self.bounds = tuple(buckets)  # the histogram's upper bounds, ascending
        self._map = mmap.mmap(-1, capacity * SLOT_WORDS * 8, mmap.MAP_SHARED)
        self._floats = memoryview(self._map).cast("d")
        self._ints = memoryview(self._map).cast("q")

    def claim(self, index: int, pid: int, deadline: float, threads: int = 0, started: float = 0.0) -> None:
        base = index * SLOT_WORDS
        self._ints[base : base + SLOT_WORDS] = memoryview(bytes(SLOT_WORDS * 8)).cast("q")
        self._ints[base + PID] = pid
        self._ints[base + THREADS] = threads
        self._floats[base + STARTED] = started
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

    def set_overdue(self, index: int, count: int) -> None:
        """Requests of this worker now past --request-timeout (the worker writes it)."""
        self._ints[index * SLOT_WORDS + OVERDUE] = count

    def overdue(self, index: int) -> int:
        return self._ints[index * SLOT_WORDS + OVERDUE]

    def counters(self, index: int) -> SlotCounters:
        """The metric words of one slot (the monitor's read)."""
        base = index * SLOT_WORDS
        ints, floats = self._ints, self._floats
        return SlotCounters(
            requests=ints[base + REQUESTS],
            in_flight=ints[base + IN_FLIGHT],
            busy=ints[base + BUSY],
            threads=ints[base + THREADS],
            started=floats[base + STARTED],
            overdue=ints[base + OVERDUE],
            duration_sum=floats[base + DURATION_SUM],
            statuses=tuple(ints[base + STATUS : base + STATUS + 5]),
            buckets=tuple(ints[base + BUCKETS : base + BUCKETS + len(self.bounds) + 1]),
        )

    def release(self, index: int) -> None:
        """The worker is gone: the slot is blank again (the monitor folded its counts first)."""
        base = index * SLOT_WORDS
        self._ints[base : base + SLOT_WORDS] = memoryview(bytes(SLOT_WORDS * 8)).cast("q")


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


class InFlight:
    """One request between request_started and request_finished (the token the loops hold)."""

    __slots__ = ("began", "method", "path", "thread")

    def __init__(self, began: float, method: str, path: bytes, thread: int) -> None:
        self.began = began  # when it was first handed to the app
        self.method = method
        self.path = path
        self.thread = thread  # the thread that runs it (the event loop's for ASGI)


class AppClock:
    """A worker's deadline from the time its requests spend *in the app*, never waiting on a client;
    and its count of requests served (both in its slot).

    Each request in the app holds the deadline from when it (last) entered it; a request that waits
    on its client (a body still arriving, a response the client reads slowly) holds nothing, and
    the connection's own body and write timeouts bound that wait. So the deadline is the oldest
    in-app start plus ``timeout``; with nothing in the app it is pushed forward by :meth:`tick`
    (a blocked loop stops ticking, so a stuck worker is still caught). Thread-safe.
    """

    def __init__(self, slots: Slots, index: int, timeout: float, now: Callable[[], float]) -> None:
        self._slots = slots
        self._index = index
        self._timeout = timeout
        self._now = now
        self._lock = threading.Lock()
        self._in_app: dict[object, float] = {}  # token -> when it entered the app (insertion = time order)
        self._waiting: set[object] = set()  # tokens waiting on their client
        self.served = 0
        # the metric words of this worker's slot (see Slots), written under the lock
        self._base = base = index * SLOT_WORDS
        self._ints = slots._ints
        self._floats = slots._floats
        self._bounds = slots.bounds
        self._in_flight = base + IN_FLIGHT
        self._busy = base + BUSY
        self._sum = base + DURATION_SUM
        self._status = base + STATUS - 1  # + status // 100
        self._buckets = base + BUCKETS

    def started(self, method: str = "", path: bytes = b"") -> InFlight:
        with self._lock:
            now = self._now()
            token = InFlight(now, method, path, threading.get_ident())
            in_app = self._in_app
            in_app[token] = now
            if len(in_app) == 1:
                self._slots.set_deadline(self._index, now + self._timeout)
            ints = self._ints
            ints[self._busy] = len(in_app)
            ints[self._in_flight] = len(in_app) + len(self._waiting)
        return token

    def waiting(self, token: object) -> None:
        with self._lock:
            if self._in_app.pop(token, None) is not None:
                self._waiting.add(token)
                self._update()

    def resumed(self, token: object) -> None:
        with self._lock:
            if token in self._waiting:
                self._waiting.discard(token)
                self._in_app[token] = self._now()
                self._update()

    def finished(self, token: object, status: int = 0) -> int:
        """The request is answered: release its deadline, count it; returns the requests served."""
        with self._lock:
            in_app = self._in_app
            if in_app.pop(token, None) is None:
                self._waiting.discard(token)
            now = self._now()
            since = next(iter(in_app.values())) if in_app else now
            slots, index = self._slots, self._index
            slots.set_deadline(index, since + self._timeout)
            served = self.served = self.served + 1
            slots.set_requests(index, served)
            # metrics: a few word writes (duration from the first hand-over to the app)
            ints = self._ints
            ints[self._busy] = len(in_app)
            ints[self._in_flight] = len(in_app) + len(self._waiting)
            if isinstance(token, InFlight):
                took = now - token.began
                self._floats[self._sum] += took
                ints[self._buckets + bisect.bisect_left(self._bounds, took)] += 1
            if 100 <= status < 600:
                ints[self._status + status // 100] += 1
        return served

    @property
    def busy(self) -> bool:
        """Some request is in the app (the deadline is held)."""
        return bool(self._in_app)

    def tick(self) -> None:
        if not self._in_app:
            self._slots.set_deadline(self._index, self._now() + self._timeout)

    def _update(self) -> None:
        in_app = self._in_app
        since = next(iter(in_app.values())) if in_app else self._now()
        self._slots.set_deadline(self._index, since + self._timeout)
        self._ints[self._busy] = len(in_app)  # a request waiting on its client holds no thread
