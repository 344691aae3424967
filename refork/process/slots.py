"""A shared-memory page of per-worker slots: the monitor reads what workers write, no messages.

Allocated by the monitor before any fork (MAP_SHARED, anonymous), so every descendant writes the
same physical page. Each slot is SLOT_WORDS 8-byte words: deadline (monotonic seconds, 0 = none),
requests served, the pid that owns it (so a stale slot is never misread), and the worker's
metrics: requests started, requests waiting on their client, its thread count, when it started,
requests past --request-timeout, the duration sum, its open WebSockets, its HTTP/2 counts (open
connections; streams, requests answered, resets received and sent, GOAWAYs sent), a table of counts by
(status class, histogram bucket), not cumulative, so that a request costs one increment there, and
its --static answers by status class. In flight
(started - served), busy (in flight - waiting), responses by class and the histogram are derived
from those words by the monitor. Only the worker writes its slot, under its AppClock's lock; the
monitor reads it lock-free, so a reading may be one request apart between two words.

With StatsD on (``--statsd-host``), a worker also *records* (AppClock(record=True)): a count per
status code, the duration of each of its last RING_SIZE requests (a ring indexed by the requests
served) and the lines it logged per level; the monitor sends them (refork.process.statsd). These
words lie past the first page of a slot: a worker that does not record never touches them.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from refork import deadlines

try:
    from refork._native import SlotWords  # typed by refork/_native.pyi
except ImportError:  # not built: the clock writes its words itself
    SlotWords = None  # type: ignore[assignment,misc]

SLOT_WORDS = 1024  # 8 KiB; only the slots in use are ever touched (their first page unless recording)
DEADLINE, REQUESTS, PID = 0, 1, 2
STARTS = 3  # requests started (request_started)
WAITING = 4  # requests in flight that wait on their client (holding no thread)
THREADS = 5  # the worker's app threads (--threads; 0 for ASGI, which has none)
STARTED = 6  # time.time() when the worker claimed the slot (float)
OVERDUE = 7  # requests past --request-timeout (written by the worker)
DURATION_SUM = 8  # seconds, float
WEBSOCKETS = 9  # open WebSockets (upgraded requests not finished yet)
LOGS = 10  # lines the worker logged, by LOG_LEVELS (4 words; recording)
LOG_LEVELS = ("critical", "error", "warning", "exception")
LOST_LINES = 14  # log lines the worker could not write (a full disk, EIO), by LOST_LOGS (2 words)
LOST_LOGS = ("access", "error")
H2 = 16  # HTTP/2, by H2_WORDS: a gauge, then counters (written on the worker's loop thread only)
H2_WORDS = ("connections", "streams", "requests", "resets_received", "resets_sent", "goaways_sent")
CELLS = 24  # counts by (status row, bucket): row 0 = no status, rows 1-5 = 1xx-5xx; bucket last = +Inf
ROWS = 6
CODES = 268  # responses by status code 100-599, at CODES + code - 100 (500 words; recording)
RING = 768  # durations in ms of the last RING_SIZE requests, the Nth served at (N - 1) % RING_SIZE
RING_SIZE = 256
MAX_BUCKETS = (CODES - CELLS) // ROWS - 1  # 39 finite buckets at most
STATIC = CELLS + ROWS * (MAX_BUCKETS + 1)  # --static answers by STATIC_CLASSES (4 words, up to CODES)
STATIC_CLASSES = ("2xx", "3xx", "4xx", "5xx")
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
    websockets: int
    http2: dict[str, int]  # by H2_WORDS
    statuses: tuple[int, ...]  # 1xx .. 5xx
    buckets: tuple[int, ...]  # per bucket (not cumulative), the last one +Inf
    lost_lines: tuple[int, ...] = (0,) * len(LOST_LOGS)  # by LOST_LOGS
    static: tuple[int, ...] = (0,) * len(STATIC_CLASSES)  # --static answers by STATIC_CLASSES


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

    def websockets(self, index: int) -> int:
        """Open WebSockets of the worker in this slot."""
        return self._ints[index * SLOT_WORDS + WEBSOCKETS]

    def busy(self, index: int) -> int:
        """Requests of the worker in this slot in the app (in flight, not waiting on their client)."""
        ints, base = self._ints, index * SLOT_WORDS
        in_flight = max(0, ints[base + STARTS] - ints[base + REQUESTS])
        return max(0, in_flight - ints[base + WAITING])

    def threads(self, index: int) -> int:
        """App threads of the worker in this slot (0 for ASGI)."""
        return self._ints[index * SLOT_WORDS + THREADS]

    def free_threads(self, index: int) -> int:
        """App threads of the worker in this slot with no request in the app (0 for ASGI)."""
        return max(0, self._ints[index * SLOT_WORDS + THREADS] - self.busy(index))

    def counters(self, index: int) -> SlotCounters:
        """The metric words of one slot (the monitor's read)."""
        base = index * SLOT_WORDS
        ints, floats = self._ints, self._floats
        starts, waiting = ints[base + STARTS], ints[base + WAITING]
        requests = ints[base + REQUESTS]
        width = len(self.bounds) + 1
        cells = base + CELLS
        rows = [ints[cells + row * width : cells + (row + 1) * width].tolist() for row in range(ROWS)]
        in_flight = max(0, starts - requests)
        return SlotCounters(
            requests=requests,
            in_flight=in_flight,
            busy=max(0, in_flight - waiting),
            threads=ints[base + THREADS],
            started=floats[base + STARTED],
            overdue=ints[base + OVERDUE],
            duration_sum=floats[base + DURATION_SUM],
            websockets=ints[base + WEBSOCKETS],
            http2=dict(zip(H2_WORDS, ints[base + H2 : base + H2 + len(H2_WORDS)].tolist(), strict=True)),
            statuses=tuple(sum(row) for row in rows[1:]),
            buckets=tuple(sum(column) for column in zip(*rows, strict=True)),
            lost_lines=tuple(ints[base + LOST_LINES : base + LOST_LINES + len(LOST_LOGS)].tolist()),
            static=tuple(ints[base + STATIC : base + STATIC + len(STATIC_CLASSES)].tolist()),
        )

    def recorded(self, index: int) -> tuple[int, int, list[int], list[int]]:
        """A recording worker's words (the StatsD reader's): owner, requests served, the counts by
        status code (100-599) and by LOG_LEVELS."""
        base = index * SLOT_WORDS
        ints = self._ints
        return (
            ints[base + PID],
            ints[base + REQUESTS],
            ints[base + CODES : base + CODES + 500].tolist(),
            ints[base + LOGS : base + LOGS + len(LOG_LEVELS)].tolist(),
        )

    def durations(self, index: int, served: int, count: int) -> list[float]:
        """The durations (ms) of requests served - count + 1 .. served (count <= RING_SIZE)."""
        ring = index * SLOT_WORDS + RING
        floats = self._floats
        return [floats[ring + (n - 1) % RING_SIZE] for n in range(served - count + 1, served + 1)]

    def count_http2(self, index: int, what: str, n: int = 1) -> None:
        """Add `n` to one of the slot's HTTP/2 words (H2_WORDS; connections: -1 when one closes)."""
        self._ints[index * SLOT_WORDS + H2 + H2_WORDS.index(what)] += n

    def count_static(self, index: int, status: int) -> None:
        """One more --static answer of this status (2xx-5xx; the worker's, under its lock)."""
        row = status // 100 - 2
        if 0 <= row < len(STATIC_CLASSES):
            self._ints[index * SLOT_WORDS + STATIC + row] += 1

    def count_log(self, index: int, level: int) -> None:
        """One more line at LOG_LEVELS[level] (the worker's log handler; recording)."""
        self._ints[index * SLOT_WORDS + LOGS + level] += 1

    def count_lost_line(self, index: int, log: str) -> None:
        """One more line of `log` (LOST_LOGS) the worker could not write (refork.logs.LostLines)."""
        self._ints[index * SLOT_WORDS + LOST_LINES + LOST_LOGS.index(log)] += 1

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

    __slots__ = ("began", "method", "path", "static", "thread")

    def __init__(self, began: float, method: str, path: bytes, thread: int) -> None:
        self.began = began  # when it was first handed to the app
        self.method = method
        self.path = path
        self.thread = thread  # the thread that runs it (the event loop's for ASGI)
        self.static = False  # a --static mount answered it (AppClock.static): not the app's request


class AppClock:
    """A worker's deadline from the time its requests spend *in the app*, never waiting on a client;
    and its count of requests served (both in its slot).

    Each request in the app holds the deadline from when it (last) entered it; a request that waits
    on its client (a body still arriving, a response the client reads slowly) holds nothing, and
    the connection's own body and write timeouts bound that wait. So the deadline is the oldest
    in-app start plus ``timeout``; with nothing in the app it is pushed forward by :meth:`tick`
    (a blocked loop stops ticking, so a stuck worker is still caught). Thread-safe.

    An open WebSocket (:meth:`upgraded`) is in flight, yet holds no deadline: it is a request that
    waits on its client for its whole life. While its app handles the handshake it is an ordinary
    request in the app (a connect handler that hangs is a hung request); once accepted it waits like
    a body still arriving, until request_finished when its socket is closed and its app returned. So a
    WebSocket open for an hour is not a hung request, the drain on a graceful stop still waits for it
    (the loop closes it with 1001/1012 first), and a loop blocked by a WebSocket handler stops
    ticking and is caught all the same. Its time between messages is not the app's: an app may await
    anything (a broadcast, a database) between two messages, for as long as the connection lives.
    """

    def __init__(
        self,
        slots: Slots,
        index: int,
        timeout: float,
        now: Callable[[], float],
        heartbeat: bool = False,
        record: bool = False,
    ) -> None:
        self._slots = slots
        self._index = index
        self._timeout = timeout
        self._now = now
        # An event loop's worker (ASGI): the deadline watches the loop, not the requests. A request
        # awaiting something holds no thread and costs its worker nothing, so it never gets the
        # worker killed (gunicorn's --timeout for async workers); the loop blocked in app code
        # stops its ticks and is caught. The soft deadline (overdue()) still sees every request.
        self._heartbeat = heartbeat
        self._lock = threading.Lock()
        self._in_app: dict[object, float] = {}  # token -> when it entered the app (insertion = time order)
        self._waiting: set[object] = set()  # tokens waiting on their client
        self._upgraded: set[object] = set()  # open WebSockets among them
        # refork.extend_deadline() and --request-timeout (see "Soft deadlines" below)
        self._extended: dict[object, float] = {}  # extended tokens in the app -> entry + extension
        self._extension: dict[object, float] = {}  # token -> seconds it extended itself by
        self._overdue: dict[object, float] = {}  # token -> when it was found past the soft deadline
        self._marked = False  # some token is in _extension or _overdue: finished() settles it
        # the native engine's current request, registered on demand (see "The native engine's
        # requests" below): engine_request(blocking=True) -> its token, or None when there is none
        self.engine_request: Callable[..., InFlight | None] | None = None
        self._pins: list[Any] = []
        # the metric words of this worker's slot (see Slots), written under the lock
        base = index * SLOT_WORDS
        self._ints = slots._ints
        self._floats = slots._floats
        self._bounds = slots.bounds
        self._starts_at = base + STARTS
        self._deadline_at = base + DEADLINE  # (started() and finished() write it themselves)
        self._requests_at = base + REQUESTS
        self._waiting_at = base + WAITING
        self._duration_at = base + DURATION_SUM
        self._websockets_at = base + WEBSOCKETS
        # recording (StatsD): where status code 0 would count (codes start at 100), the ring
        self._codes_at = base + CODES - 100 if record else 0
        self._ring_at = base + RING
        width = len(slots.bounds) + 1  # the first cell of each status's row, by status (0-599)
        self._row = [base + CELLS + (code // 100 if code >= 100 else 0) * width for code in range(600)]
        # started() and finished()'s writes in one native call each where the extension is built
        # (refork._native.SlotWords, the native engine's own writes); else _write_*() below
        self._words: Any = None if SlotWords is None else SlotWords(self.native_words())

    def started(self, method: str = "", path: bytes = b"") -> InFlight:
        lock = self._lock  # (acquire/release, not `with`: a thousand instructions less a call)
        lock.acquire()
        try:
            now = self._now()
            token = InFlight(now, method, path, threading.get_ident())
            in_app = self._in_app
            in_app[token] = now
            deadline = now + self._timeout if len(in_app) == 1 or self._heartbeat else -1.0
            if self._words is not None:
                self._words.started(deadline)
            else:
                self._write_started(deadline)
        finally:
            lock.release()
        return token

    def _write_started(self, deadline: float) -> None:
        """The deadline (a negative one: unchanged) and the started count (in flight = started - served)."""
        if deadline >= 0.0:
            self._floats[self._deadline_at] = deadline
        self._ints[self._starts_at] += 1

    def waiting(self, token: object) -> None:
        with self._lock:
            if self._in_app.pop(token, None) is not None or self._extended.pop(token, None) is not None:
                self._waiting.add(token)
                self._update()

    def upgraded(self, token: object) -> None:
        """The request became an open WebSocket: it waits on its client until finished() (see the
        class docstring), counted in the slot's WEBSOCKETS word."""
        with self._lock:
            if self._in_app.pop(token, None) is not None or self._extended.pop(token, None) is not None:
                self._waiting.add(token)
            if token in self._waiting:
                self._upgraded.add(token)
                self._ints[self._websockets_at] = len(self._upgraded)
                self._update()

    def resumed(self, token: object) -> None:
        with self._lock:
            if token in self._waiting:
                self._waiting.discard(token)
                extension = self._extension.get(token)
                if extension is None:
                    self._in_app[token] = self._now()
                else:
                    self._extended[token] = self._now() + extension
                self._update()

    def finished(self, token: object, status: int = 0) -> int:
        """The request is answered: release its deadline, count it; returns the requests served."""
        lock = self._lock
        lock.acquire()
        try:
            in_app = self._in_app
            if in_app.pop(token, None) is None:
                self._waiting.discard(token)
                self._ints[self._waiting_at] = len(self._waiting)
                if self._upgraded:
                    self._upgraded.discard(token)
                    self._ints[self._websockets_at] = len(self._upgraded)
            now = self._now()
            since = next(iter(in_app.values())) if in_app else now
            if self._marked:
                since = self._settle(token, since)
            deadline = (now if self._heartbeat else since) + self._timeout
            took = now - token.began  # type: ignore[attr-defined]  # an InFlight from started()
            served: int
            if token.static:  # type: ignore[attr-defined]
                served = self._write_static(deadline)
            elif self._words is not None:
                served = self._words.finished(deadline, took, status)
            else:
                served = self._write_finished(deadline, took, status)
        finally:
            lock.release()
        return served

    def _write_finished(self, deadline: float, took: float, status: int) -> int:
        """The deadline, the served count, the duration sum and one histogram cell by (status class,
        bucket); recording, the status count and the ring too. Returns the requests served."""
        self._floats[self._deadline_at] = deadline
        served = int(self._ints[self._requests_at]) + 1
        if self._codes_at:  # recording: before the count that says the ring holds it
            if 100 <= status < 600:
                self._ints[self._codes_at + status] += 1
            self._floats[self._ring_at + (served - 1) % RING_SIZE] = took * 1000.0
        self._ints[self._requests_at] = served
        self._floats[self._duration_at] += took
        try:
            row = self._row[status]
        except IndexError:  # not an HTTP status: counted with the requests that have none
            row = self._row[0]
        self._ints[row + bisect_left(self._bounds, took)] += 1
        return served

    def _write_static(self, deadline: float) -> int:
        """A --static answer's finish: the deadline, and out of flight without being served (its
        count is refork_static_requests_total's). Returns the requests served."""
        self._floats[self._deadline_at] = deadline
        self._ints[self._starts_at] -= 1
        return int(self._ints[self._requests_at])

    def count_static(self, status: int) -> None:
        """One more --static answer of this status: an atomic add where the extension is built (the
        pool engine's I/O thread counts its own answers in the same words, without this lock)."""
        if self._words is not None:
            self._words.count_static(status)
        else:
            with self._lock:
                self._slots.count_static(self._index, status)

    def static(self, token: object) -> None:
        """A --static mount answers this request (the engine's: registered now): finished() takes
        it out of flight without counting it among the app's requests, their statuses and times."""
        if token is deadlines.ENGINE:
            token = self.engine_request() if self.engine_request is not None else None
        if isinstance(token, InFlight):
            token.static = True

    @property
    def served(self) -> int:
        """Requests served (the slot's count: the native engine adds to it too)."""
        return int(self._ints[self._requests_at])

    # -- The native engine's requests --------------------------------------------------------------
    #
    # The engine (refork._native.Engine, one app thread) accounts the requests it serves in this
    # slot itself, with the same words and rules as started() and finished() for a request that is
    # alone in the app (which it always is: the engine calls the app on the worker's only thread).
    # Its request gets a token only when something asks (extend(), overdue()): `engine_request`
    # then registers it through adopt(), and the engine finishes it through finished().

    def native_words(self) -> dict[str, Any]:
        """Where the engine writes: the slot's address (pinned), the word indexes in it, the timeout
        and the histogram's bounds."""
        pin = ctypes.c_char.from_buffer(self._slots._map)
        self._pins.append(pin)
        return {
            "address": ctypes.addressof(pin) + self._index * SLOT_WORDS * 8,
            "deadline": DEADLINE, "starts": STARTS, "requests": REQUESTS, "duration": DURATION_SUM,
            "cells": CELLS, "timeout": self._timeout, "bounds": tuple(self._bounds),
            "codes": CODES if self._codes_at else 0, "ring": RING, "ring_size": RING_SIZE,
            "static": STATIC,
        }  # fmt: skip

    def use_engine_request(self, find: Callable[..., InFlight | None]) -> None:
        """The engine's `engine_request` (its refork._native.Current), set when the engine is built."""
        self.engine_request = find

    def adopt(self, began: float, method: str, path: bytes, blocking: bool = True) -> InFlight | None:
        """Register the engine's request in the app (began at `began`): a token like started()'s,
        without counting it again. None if `blocking` is False and the lock is held."""
        if not self._lock.acquire(blocking):
            return None
        try:
            token = InFlight(began, method, path, threading.get_ident())
            self._in_app[token] = began
            return token
        finally:
            self._lock.release()

    @property
    def busy(self) -> bool:
        """Some request is in the app (the deadline is held)."""
        return bool(self._in_app or self._extended)

    def in_flight_since(self, moment: float) -> bool:
        """Some request that began at or before `moment` is still in flight (in the app, or awaiting
        its client; an open WebSocket does not count): what keeps a worker from a safe point."""
        with self._lock:
            if self._in_app and next(iter(self._in_app.values())) <= moment:
                return True
            tokens = [*self._extended, *(t for t in self._waiting if t not in self._upgraded)]
        return any(t.began <= moment for t in tokens)  # type: ignore[attr-defined]  # InFlight tokens

    def tick(self) -> None:
        if self._marked or self._heartbeat:
            with self._lock:
                self._update()  # also corrects a deadline started() left late (see extend())
        elif not self._in_app:
            self._slots.set_deadline(self._index, self._now() + self._timeout)

    def _update(self) -> None:
        self._slots.set_deadline(self._index, self._oldest() + self._timeout)
        self._ints[self._waiting_at] = len(self._waiting)  # in flight, holding no thread

    def _oldest(self) -> float:
        """When the request holding the deadline entered the app (its extension added); now if none
        (and always for a loop's heartbeat)."""
        if self._heartbeat:
            return self._now()
        in_app, extended = self._in_app, self._extended
        since = next(iter(in_app.values())) if in_app else None
        if extended:
            oldest = min(extended.values())
            return oldest if since is None or oldest < since else since
        return self._now() if since is None else since

    # -- Soft deadlines (--request-timeout) and refork.extend_deadline() ---------------------------
    #
    # An extended request leaves _in_app (whose insertion order is its time order, which the hot
    # path relies on) for _extended, with its entry time pushed by its extension: its share of the
    # hard deadline and its soft deadline both move, nobody else's does. finished() settles marked
    # tokens (_settle); started() does not look at _extended, so a request started while an older
    # extended one is in the app may leave the deadline late (never early) until the next tick.

    def extend(self, token: object, seconds: float) -> bool:
        """refork.extend_deadline(): push this request's deadlines by `seconds` (added to any
        earlier extension). False if the request is over."""
        if token is deadlines.ENGINE:
            token = self.engine_request() if self.engine_request is not None else None
            if token is None:
                return False
        with self._lock:
            entered = self._in_app.pop(token, None)
            if entered is not None:
                self._extended[token] = entered + seconds
            elif token in self._extended:
                self._extended[token] += seconds
            elif token not in self._waiting:
                return False
            self._extension[token] = self._extension.get(token, 0.0) + seconds
            self._marked = True
            self._update()
        return True

    def overdue(self, soft_timeout: float, blocking: bool = True) -> list[InFlight] | None:
        """Requests in the app for longer than `soft_timeout` (plus their extension) that were not
        returned before: each overdue request is returned once, and counted in :attr:`hung` until
        it finishes. None if `blocking` is False and the lock is held (a signal handler that
        interrupted this very thread must not wait for it)."""
        if self.engine_request is not None:
            self.engine_request(blocking)  # the engine's request in the app, if any, gets its token
        if not self._lock.acquire(blocking):
            return None
        try:
            now = self._now()
            limit = now - soft_timeout
            reported = self._overdue
            found: list[InFlight] = []
            for token, entered in self._in_app.items():
                if entered >= limit:
                    break  # insertion order is time order: the rest are younger
                if token not in reported and isinstance(token, InFlight):
                    found.append(token)
            for token, entered in self._extended.items():
                if entered < limit and token not in reported and isinstance(token, InFlight):
                    found.append(token)
            for token in found:
                reported[token] = now
            if found:
                self._marked = True
            return found
        finally:
            self._lock.release()

    @property
    def hung(self) -> int:
        """Requests found overdue and still in flight (their threads are not free capacity)."""
        return len(self._overdue)

    def extension(self, token: object) -> float:
        """Seconds this request extended its deadlines by."""
        return self._extension.get(token, 0.0)

    def _settle(self, token: object, since: float) -> float:
        """finished(token) with marked tokens about (lock held): forget it; the deadline's `since`."""
        self._extension.pop(token, None)
        self._extended.pop(token, None)
        self._overdue.pop(token, None)
        self._marked = bool(self._extension or self._overdue)
        if self._extended:
            oldest = min(self._extended.values())
            return min(oldest, since) if self._in_app else oldest
        return since
