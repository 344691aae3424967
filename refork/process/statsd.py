"""StatsD / DogStatsD: gunicorn's metrics, sent by the monitor once a second, never by a request.

gunicorn sends a datagram per request from the worker. Here a worker only *records* into its slot
of the shared page (refork.process.slots: a count per status code, its last requests' durations,
its log lines per level); the monitor reads the slots each second and sends what changed:

- ``gunicorn.requests`` (counter) and ``gunicorn.request.status.NNN`` (counters), the increase
  since the last send;
- ``gunicorn.request.duration`` (timer, ms): one sample per request, as gunicorn sends; a worker
  keeps its last RING_SIZE durations, so past that many requests a second the samples are the
  latest ones and carry the sample rate (``|@0.25``: each stands for four);
- ``gunicorn.workers`` (gauge): the worker processes;
- ``gunicorn.log.critical|error|warning|exception`` (counters): lines logged by the monitor and
  the workers at those levels (``exception``: an error with a traceback, as gunicorn counts it);
- refork's own: ``refork.worker.N.memory.uss`` and ``.pss`` (gauges, bytes) for worker N, when a
  new memory sample is taken (``--memory-interval``).

Names carry ``--statsd-prefix`` (a "." added); ``--dogstatsd-tags`` are appended to every line
(``|#env:prod``). Lines are packed into datagrams of at most MAX_DATAGRAM bytes; a send that
fails (nothing listens, the socket buffer is full) drops those lines: metrics never wait.
A host name is resolved by a thread of its own (Resolver), never by the monitor's loop: a
resolver that does not answer would otherwise stop the loop for its timeout every second.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from refork.addresses import TcpAddress, UnixAddress, parse_statsd
from refork.process.slots import LOG_LEVELS, RING_SIZE, Slots

log = logging.getLogger("refork")

MAX_DATAGRAM = 1432  # bytes: fits one Ethernet frame over IPv4 or IPv6 (UDP)
FLUSH = 1.0  # seconds between two sends
REFRESH = 60.0  # seconds between two lookups of a host name that resolved (it may move)
RETRY = (1.0, 30.0)  # seconds before a failed lookup is tried again: the first, doubling to the last
SLOW = 2.0  # seconds without an address before the operator is told metrics are dropped


def prefix_of(text: str) -> str:
    """`--statsd-prefix` as it leads a name: "app" and "app." give "app."; "" gives ""."""
    text = text.strip().rstrip(".")
    return text + "." if text else ""


@dataclass(frozen=True)
class Format:
    """How a metric is written: gunicorn's names and types under the prefix, the tags after."""

    prefix: str = ""
    tags: str = ""

    def _line(self, body: str) -> str:
        return f"{self.prefix}{body}|#{self.tags}" if self.tags else f"{self.prefix}{body}"

    def gauge(self, name: str, value: float) -> str:
        return self._line(f"{name}:{value}|g")

    def count(self, name: str, value: int) -> str:
        return self._line(f"{name}:{value}|c|@1.0")

    def timer(self, name: str, ms: float, rate: float = 1.0) -> str:
        return self._line(f"{name}:{ms}|ms" if rate >= 1.0 else f"{name}:{ms}|ms|@{rate:.6g}")


def datagrams(lines: Iterable[str], limit: int = MAX_DATAGRAM) -> list[bytes]:
    """Lines joined by newlines into datagrams of at most `limit` bytes (a longer line alone)."""
    out: list[bytes] = []
    current = b""
    for line in lines:
        data = line.encode("ascii", "replace")
        if current and len(current) + 1 + len(data) > limit:
            out.append(current)
            current = b""
        current = current + b"\n" + data if current else data
    if current:
        out.append(current)
    return out


@dataclass
class _Seen:
    """What the last send read of one worker's slot."""

    pid: int
    requests: int
    codes: list[int]
    logs: list[int]


@dataclass(frozen=True)
class WorkerView:
    """A worker as the monitor knows it: its slot, pid, number and latest memory sample."""

    slot: int
    pid: int
    nr: int
    uss: int | None = None
    pss: int | None = None
    sampled_at: float = 0.0


class Readings:
    """The lines of one send from the slots as read now (pure but for the slots' words)."""

    def __init__(self, fmt: Format, slots: Slots) -> None:
        self.fmt = fmt
        self.slots = slots
        self.seen: dict[int, _Seen] = {}  # by slot
        self.memory_at: dict[int, float] = {}  # by pid: the sample already sent
        self.requests = 0  # since the last lines()
        self.codes: dict[int, int] = {}
        self.logs = [0] * len(LOG_LEVELS)
        self.durations: list[tuple[float, float]] = []  # (ms, sample rate)

    def read(self, slot: int) -> None:
        """Add what a worker's slot gained since the last read."""
        pid, requests, codes, logs = self.slots.recorded(slot)
        seen = self.seen.get(slot)
        if pid == 0:
            return
        if seen is None or seen.pid != pid:  # a new worker in this slot: it starts from 0
            seen = self.seen[slot] = _Seen(pid, 0, [0] * len(codes), [0] * len(LOG_LEVELS))
        new = requests - seen.requests
        if new > 0:
            self.requests += new
            kept = min(new, RING_SIZE)
            rate = kept / new
            self.durations += [(ms, rate) for ms in self.slots.durations(slot, requests, kept)]
            for i, (now, before) in enumerate(zip(codes, seen.codes, strict=True)):
                if now != before:
                    self.codes[100 + i] = self.codes.get(100 + i, 0) + now - before
            seen.requests, seen.codes = requests, codes
        for i, (now, before) in enumerate(zip(logs, seen.logs, strict=True)):
            self.logs[i] += now - before
        seen.logs = logs

    def forget(self, slot: int) -> None:
        """The worker of this slot is gone (after a last read)."""
        self.seen.pop(slot, None)

    def lines(self, workers: list[WorkerView], monitor_logs: list[int]) -> list[str]:
        """Everything to send now; the counts start again from zero."""
        fmt = self.fmt
        out = [fmt.gauge("gunicorn.workers", len(workers))]
        if self.requests:
            out.append(fmt.count("gunicorn.requests", self.requests))
        for code in sorted(self.codes):
            out.append(fmt.count(f"gunicorn.request.status.{code}", self.codes[code]))
        out += [fmt.timer("gunicorn.request.duration", round(ms, 3), rate) for ms, rate in self.durations]
        for i, level in enumerate(LOG_LEVELS):
            n = self.logs[i] + monitor_logs[i]
            if n:
                out.append(fmt.count(f"gunicorn.log.{level}", n))
        for w in workers:
            if w.uss is not None and self.memory_at.get(w.pid) != w.sampled_at:
                self.memory_at[w.pid] = w.sampled_at
                out.append(fmt.gauge(f"refork.worker.{w.nr}.memory.uss", w.uss))
                if w.pss is not None:
                    out.append(fmt.gauge(f"refork.worker.{w.nr}.memory.pss", w.pss))
        alive = {w.pid for w in workers}
        self.memory_at = {pid: at for pid, at in self.memory_at.items() if pid in alive}
        self.requests, self.codes, self.durations = 0, {}, []
        self.logs = [0] * len(LOG_LEVELS)
        monitor_logs[:] = [0] * len(LOG_LEVELS)
        return out


class LogCounter(logging.Handler):
    """Counts the lines of the "refork" logger by LOG_LEVELS into `count` (set per process)."""

    def __init__(self, count: Callable[[int], None]) -> None:
        super().__init__(logging.WARNING)
        self.count = count

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.CRITICAL:
            self.count(0)
        elif record.levelno >= logging.ERROR:
            self.count(3 if record.exc_info else 1)
        else:
            self.count(2)


def count_logs(count: Callable[[int], None]) -> None:
    """Count this process's "refork" lines into `count` (one counter per logger: set, not added)."""
    logger = logging.getLogger("refork")
    for handler in list(logger.handlers):
        if isinstance(handler, LogCounter):
            logger.removeHandler(handler)
    logger.addHandler(LogCounter(count))


Resolved = tuple[int, Any]  # (family, socket address)


class Resolver:
    """A UDP target's address, looked up off the monitor's loop.

    An IP address is known at once. A host name is looked up by a daemon thread, again every
    REFRESH seconds (the agent may move), sooner while lookups fail; `address` is the latest
    answer (None until the first). The thread only assigns attributes and logs nothing (the loop
    says what it finds), so a mold forked while a lookup waits inherits no lock of refork's or
    of the logging module's held (glibc waits on the network holding none of its own).
    """

    def __init__(self, target: TcpAddress) -> None:
        self.target = target
        self.address: Resolved | None = None
        self.error: Exception | None = None  # the last lookup's failure, None once one answers
        self.stopped = threading.Event()
        try:
            self.address = self._lookup(socket.AI_NUMERICHOST)
        except (OSError, UnicodeError):
            threading.Thread(target=self._run, name="refork statsd resolver", daemon=True).start()

    def _lookup(self, flags: int = 0) -> Resolved:
        family = socket.AF_INET6 if self.target.ipv6 else 0
        info = socket.getaddrinfo(self.target.host, self.target.port, family, socket.SOCK_DGRAM, 0, flags)
        return info[0][0], info[0][4]

    def _run(self) -> None:
        retry = RETRY[0]
        while not self.stopped.is_set():
            try:
                self.address, self.error = self._lookup(), None
                wait, retry = REFRESH, RETRY[0]
            except (OSError, UnicodeError) as e:  # the last address stays: a failed refresh is no move
                self.error = e
                wait, retry = retry, min(retry * 2, RETRY[1])
            self.stopped.wait(wait)

    def close(self) -> None:
        self.stopped.set()  # a lookup under way ends on its own; its answer goes nowhere


class Statsd:
    """The monitor's sender: `flush()` once a second reads the slots and sends the lines."""

    def __init__(self, address: str, prefix: str, tags: str, slots: Slots) -> None:
        self.address = address
        self.readings = Readings(Format(prefix_of(prefix), tags), slots)
        self.monitor_logs = [0] * len(LOG_LEVELS)
        self.next_flush = 0.0
        self.sock: socket.socket | None = None
        self.failed = False  # the last send failed (said once at debug level, until one succeeds)
        self.target = parse_statsd(address)
        self.resolver = None if isinstance(self.target, UnixAddress) else Resolver(self.target)
        self.connected: Resolved | None = None  # where self.sock sends
        self.created = time.monotonic()
        self.dropped = 0  # lines dropped for want of an address, since the operator was told
        self.unresolved_said = False
        count_logs(self.count_monitor_log)

    def count_monitor_log(self, level: int) -> None:
        self.monitor_logs[level] += 1

    def _socket(self) -> socket.socket | None:
        where: Resolved | None
        if isinstance(self.target, UnixAddress):
            where = (socket.AF_UNIX, self.target.path)
        else:
            assert self.resolver is not None
            where = self.resolver.address  # read once: the resolver's thread may replace it
        if where is None:
            return None
        if self.sock is not None and where != self.connected:  # the name moved: follow it
            self.sock.close()
            self.sock = None
        if self.sock is None:
            sock = socket.socket(where[0], socket.SOCK_DGRAM)
            try:
                sock.setblocking(False)
                sock.connect(where[1])
            except OSError as e:
                sock.close()
                self._failed(e)
                return None
            self.sock, self.connected = sock, where
        return self.sock

    def _unresolved(self, lines: int) -> None:
        """No address yet: these lines are dropped and counted; past SLOW seconds, said once."""
        self.dropped += lines
        if self.unresolved_said or self.resolver is None:
            return
        waited = time.monotonic() - self.created
        if self.resolver.error is not None or waited >= SLOW:
            why = self.resolver.error or f"no answer in {waited:.0f}s"
            log.warning("statsd: cannot resolve %s yet (%s): metrics are dropped until it resolves",
                        self.address, why)  # fmt: skip
            self.unresolved_said = True

    def _resolved(self) -> None:
        if self.unresolved_said:
            log.info("statsd: %s resolved; %d metric lines were dropped before", self.address, self.dropped)
        self.unresolved_said, self.dropped = False, 0

    def _failed(self, e: OSError) -> None:
        if not self.failed:
            self.failed = True
            log.debug("statsd: cannot send to %s (%s); metrics are dropped until it can", self.address, e)

    def worker_gone(self, slot: int) -> None:
        """Before a slot is released: its last counts."""
        self.readings.read(slot)
        self.readings.forget(slot)

    def tick(self, now: float, workers: list[WorkerView]) -> None:
        """Send, if a second has passed since the last send."""
        if now < self.next_flush:
            return
        self.next_flush = now + FLUSH
        self.flush(workers)

    def flush(self, workers: list[WorkerView]) -> None:
        for w in workers:
            self.readings.read(w.slot)
        lines = self.readings.lines(workers, self.monitor_logs)
        sock = self._socket()
        if sock is None:
            if self.resolver is not None and self.resolver.address is None:
                self._unresolved(len(lines))
            return
        if self.dropped or self.unresolved_said:
            self._resolved()
        for datagram in datagrams(lines):
            try:
                sock.send(datagram)
            except OSError as e:  # nothing listens (yet), a full buffer: these lines are lost
                self._failed(e)
                gone = isinstance(e, (ConnectionRefusedError, FileNotFoundError))
                if gone and sock.family == socket.AF_UNIX:
                    sock.close()  # a unix receiver that went away may come back at another inode
                    self.sock = None
                return
        self.failed = False

    def close(self) -> None:
        logger = logging.getLogger("refork")
        for handler in list(logger.handlers):
            if isinstance(handler, LogCounter):
                logger.removeHandler(handler)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.resolver is not None:
            self.resolver.close()
            if self.resolver.address is None and self.dropped:
                log.warning("statsd: %s never resolved: %d metric lines dropped", self.address, self.dropped)
