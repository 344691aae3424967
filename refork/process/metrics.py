"""The Prometheus text exposition (format 0.0.4) of a server, rendered by the monitor.

Pure: `render(snapshot)` turns what the monitor read (the slots page, the supervisor's state,
memory samples, the listeners' queues) into text; no I/O, no clock. Every counter is monotonic
server-wide: when a worker exits the monitor folds its slot into `Totals` first, so the
server-wide families (`refork_requests_total`, ...) never go down; the per-worker families
(`refork_worker_*`) start again at 0 with a new worker, which Prometheus reads as a reset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from refork.memory.accounting import ProcessMemory
from refork.process.slots import LOST_LOGS, STATIC_CLASSES, STATUS_CLASSES, SlotCounters

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
RESTART_CAUSES = ("crash", "timeout", "memory", "max_requests", "reload", "refork")  # always shown
WORKER_STATES = ("starting", "ready", "stopping")
MOLD_STATES = ("starting", "ready", "stopped_idle", "none")
COMMANDS = ("status", "refork", "reload", "ttin", "ttou")


@dataclass
class Totals:
    """The counts of workers that exited, kept by the monitor for the server-wide counters."""

    buckets: int  # finite histogram buckets
    requests: int = 0
    duration_sum: float = 0.0
    statuses: list[int] = field(default_factory=lambda: [0] * len(STATUS_CLASSES))
    histogram: list[int] = field(default_factory=list)
    http2: dict[str, int] = field(default_factory=dict)  # the counters of H2_WORDS (not the gauge)
    lost_lines: list[int] = field(default_factory=lambda: [0] * len(LOST_LOGS))
    static: list[int] = field(default_factory=lambda: [0] * len(STATIC_CLASSES))

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.buckets + 1)

    def fold(self, counters: SlotCounters) -> None:
        self.requests += counters.requests
        self.duration_sum += counters.duration_sum
        for i, n in enumerate(counters.statuses):
            self.statuses[i] += n
        for i, n in enumerate(counters.buckets):
            self.histogram[i] += n
        for what, n in counters.http2.items():
            if what != "connections":
                self.http2[what] = self.http2.get(what, 0) + n
        for i, n in enumerate(counters.lost_lines):
            self.lost_lines[i] += n
        for i, n in enumerate(counters.static):
            self.static[i] += n


@dataclass(frozen=True)
class WorkerSample:
    nr: int
    generation: int
    counters: SlotCounters | None  # None until the worker claimed its slot
    memory: ProcessMemory | None


@dataclass(frozen=True)
class ListenerSample:
    name: str  # as the log says it: 127.0.0.1:8000, unix:/run/app.sock
    queued: int | None
    limit: int | None


@dataclass
class Snapshot:
    """Everything one scrape shows; built by the monitor (Monitor.metrics_snapshot)."""

    bounds: Sequence[float]
    now: float  # time.time(), for the workers' ages
    totals: Totals
    workers: list[WorkerSample] = field(default_factory=list)
    worker_states: Mapping[str, int] = field(default_factory=dict)
    target_workers: int = 0
    restarts: Mapping[str, int] = field(default_factory=dict)
    generation: int = 0
    mold_state: str = "none"
    mold_pending: bool = False
    listeners: list[ListenerSample] = field(default_factory=list)
    commands: Mapping[str, int] = field(default_factory=dict)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str) -> None:
        self.lines.append(f"# HELP {name} {text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, labels: Iterable[tuple[str, str]] = ()) -> None:
        pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        self.lines.append(f"{name}{{{pairs}}} {_number(value)}" if pairs else f"{name} {_number(value)}")

    def histogram(
        self,
        name: str,
        bounds: Sequence[float],
        buckets: Sequence[int],
        total: float,
        labels: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """Buckets are per bucket (the last one past every bound); rendered cumulative. The count is
        the +Inf bucket, so the three always agree even if a reading was taken mid-request."""
        running = 0
        for bound, n in zip((*bounds, math.inf), buckets, strict=True):
            running += n
            self.sample(f"{name}_bucket", running, (*labels, ("le", _number(float(bound)))))
        self.sample(f"{name}_sum", total, labels)
        self.sample(f"{name}_count", running, labels)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(snap: Snapshot) -> str:
    """The whole exposition: server-wide families first, then one series per worker."""
    out = _Text()
    live = [w for w in snap.workers if w.counters is not None]
    _server(out, snap, live)
    _workers(out, snap, live)
    return out.text()


def _server(out: _Text, snap: Snapshot, live: list[WorkerSample]) -> None:
    totals = snap.totals
    requests = totals.requests
    statuses = list(totals.statuses)
    histogram = list(totals.histogram)
    duration = totals.duration_sum
    lost = list(totals.lost_lines)
    static = list(totals.static)
    for w in live:
        c = w.counters
        assert c is not None
        requests += c.requests
        duration += c.duration_sum
        statuses = [a + b for a, b in zip(statuses, c.statuses, strict=True)]
        histogram = [a + b for a, b in zip(histogram, c.buckets, strict=True)]
        lost = [a + b for a, b in zip(lost, c.lost_lines, strict=True)]
        static = [a + b for a, b in zip(static, c.static, strict=True)]

    out.family(
        "refork_requests_total", "counter", "Requests answered by every worker since the server started."
    )
    out.sample("refork_requests_total", requests)
    out.family(
        "refork_responses_total", "counter", "Responses by status class, every worker since the start."
    )
    for cls, n in zip(STATUS_CLASSES, statuses, strict=True):
        out.sample("refork_responses_total", n, (("code", cls),))
    out.family(
        "refork_request_duration_seconds",
        "histogram",
        "Time from a request's hand-over to the app to its answer, every worker since the start.",
    )
    out.histogram("refork_request_duration_seconds", snap.bounds, histogram, duration)

    out.family(
        "refork_static_requests_total", "counter", "Requests answered by a --static mount, by status class "
        "(not in refork_requests_total: those are the app's)."
    )
    for cls, n in zip(STATIC_CLASSES, static, strict=True):
        out.sample("refork_static_requests_total", n, (("code", cls),))
    _http2(out, snap, live, requests + sum(static))
    out.family("refork_websockets", "gauge", "Open WebSockets, every live worker.")
    out.sample("refork_websockets", sum(w.counters.websockets for w in live if w.counters is not None))
    out.family("refork_log_write_errors_total", "counter", "Log lines workers could not write, by log.")
    for log, n in zip(LOST_LOGS, lost, strict=True):
        out.sample("refork_log_write_errors_total", n, (("log", log),))
    out.family("refork_workers", "gauge", "Worker processes by state.")
    for state in WORKER_STATES:
        out.sample("refork_workers", snap.worker_states.get(state, 0), (("state", state),))
    out.family("refork_workers_target", "gauge", "The worker count the monitor keeps (-w, TTIN/TTOU).")
    out.sample("refork_workers_target", snap.target_workers)
    out.family("refork_worker_restarts_total", "counter", "Workers replaced, by cause.")
    causes = [*RESTART_CAUSES, *sorted(set(snap.restarts) - set(RESTART_CAUSES))]
    for cause in causes:
        out.sample("refork_worker_restarts_total", snap.restarts.get(cause, 0), (("cause", cause),))
    out.family("refork_generation", "gauge", "The current mold's generation (+1 per reload or refork).")
    out.sample("refork_generation", snap.generation)
    out.family("refork_mold_state", "gauge", "1 for the current mold's state, 0 for the others.")
    for state in MOLD_STATES:
        out.sample("refork_mold_state", int(state == snap.mold_state), (("state", state),))
    out.family("refork_mold_pending", "gauge", "1 while a new mold (reload, refork) is starting.")
    out.sample("refork_mold_pending", int(snap.mold_pending))

    known = [q for q in snap.listeners if q.queued is not None]
    if known:
        out.family("refork_listen_queue_length", "gauge", "Connections waiting in a listener's accept queue.")
        for q in known:
            out.sample("refork_listen_queue_length", q.queued or 0, (("listener", q.name),))
        out.family("refork_listen_queue_limit", "gauge", "The accept queue's limit (the effective backlog).")
        for q in known:
            out.sample("refork_listen_queue_limit", q.limit or 0, (("listener", q.name),))

    out.family("refork_control_commands_total", "counter", "Control-socket commands answered, by command.")
    commands = [*COMMANDS, *sorted(set(snap.commands) - set(COMMANDS))]
    for command in commands:
        out.sample("refork_control_commands_total", snap.commands.get(command, 0), (("command", command),))


def _http2(out: _Text, snap: Snapshot, live: list[WorkerSample], requests: int) -> None:
    """Requests by protocol (`requests`: the app's and the --static mounts'), and HTTP/2's own
    counts (h2 over TLS or h2c)."""
    counts = dict(snap.totals.http2)
    for w in live:
        assert w.counters is not None
        for what, n in w.counters.http2.items():
            counts[what] = counts.get(what, 0) + n
    h2 = counts.get("requests", 0)
    out.family("refork_protocol_requests_total", "counter", "Requests answered, by protocol, every worker.")
    out.sample("refork_protocol_requests_total", requests - h2, (("protocol", "HTTP/1.1"),))
    out.sample("refork_protocol_requests_total", h2, (("protocol", "HTTP/2"),))
    out.family("refork_http2_connections", "gauge", "Open HTTP/2 connections, every live worker.")
    out.sample("refork_http2_connections", counts.get("connections", 0))
    out.family("refork_http2_streams_total", "counter", "HTTP/2 streams clients opened, every worker.")
    out.sample("refork_http2_streams_total", counts.get("streams", 0))
    out.family("refork_http2_resets_total", "counter", "RST_STREAM frames, received from clients and sent.")
    out.sample("refork_http2_resets_total", counts.get("resets_received", 0), (("direction", "received"),))
    out.sample("refork_http2_resets_total", counts.get("resets_sent", 0), (("direction", "sent"),))
    out.family("refork_http2_goaways_sent_total", "counter", "GOAWAY frames sent (graceful or on an error).")
    out.sample("refork_http2_goaways_sent_total", counts.get("goaways_sent", 0))


def _workers(out: _Text, snap: Snapshot, live: list[WorkerSample]) -> None:
    def ids(w: WorkerSample) -> tuple[tuple[str, str], ...]:
        return (("worker", str(w.nr)), ("generation", str(w.generation)))

    def each(name: str, kind: str, text: str, value: Callable[[WorkerSample], float | None]) -> None:
        rows = [(w, value(w)) for w in live]
        rows = [(w, v) for w, v in rows if v is not None]
        if not rows:
            return
        out.family(name, kind, text)
        for w, v in rows:
            assert v is not None
            out.sample(name, v, ids(w))

    def c(w: WorkerSample) -> SlotCounters:
        assert w.counters is not None
        return w.counters

    each("refork_worker_requests_total", "counter", "Requests this worker answered.", lambda w: c(w).requests)
    if live:
        out.family("refork_worker_responses_total", "counter", "Responses of this worker by status class.")
        for w in live:
            for cls, n in zip(STATUS_CLASSES, c(w).statuses, strict=True):
                out.sample("refork_worker_responses_total", n, (*ids(w), ("code", cls)))
        name = "refork_worker_request_duration_seconds"
        out.family(
            name, "histogram", "Time from a request's hand-over to the app to its answer, this worker."
        )
        for w in live:
            out.histogram(name, snap.bounds, c(w).buckets, c(w).duration_sum, ids(w))
    each(
        "refork_worker_requests_in_flight",
        "gauge",
        "Requests started and not yet answered (in the app or waiting on their client).",
        lambda w: c(w).in_flight,
    )
    each(
        "refork_worker_websockets",
        "gauge",
        "Open WebSockets of this worker (counted in its requests in flight too).",
        lambda w: c(w).websockets,
    )
    each(
        "refork_worker_http2_connections",
        "gauge",
        "Open HTTP/2 connections of this worker.",
        lambda w: c(w).http2["connections"],
    )
    each(
        "refork_worker_overdue_requests",
        "gauge",
        "Requests in flight past --request-timeout.",
        lambda w: c(w).overdue,
    )
    each(
        "refork_worker_busy_threads",
        "gauge",
        "App threads running a request (WSGI; --threads).",
        lambda w: min(c(w).busy, c(w).threads) if c(w).threads else None,
    )
    each(
        "refork_worker_idle_threads",
        "gauge",
        "App threads free for a request (WSGI; --threads).",
        lambda w: max(0, c(w).threads - c(w).busy) if c(w).threads else None,
    )
    each(
        "refork_worker_age_seconds",
        "gauge",
        "Seconds since the worker was forked.",
        lambda w: round(max(0.0, snap.now - c(w).started), 3) if c(w).started else None,
    )
    each(
        "refork_worker_rss_bytes", "gauge", "Resident set size.", lambda w: w.memory.rss if w.memory else None
    )
    each(
        "refork_worker_pss_bytes",
        "gauge",
        "Proportional set size: shared pages divided among their sharers.",
        lambda w: w.memory.pss if w.memory else None,
    )
    each(
        "refork_worker_uss_bytes",
        "gauge",
        "Unique set size: what the worker's exit would free.",
        lambda w: w.memory.uss if w.memory else None,
    )
    each(
        "refork_worker_minor_faults_total",
        "counter",
        "Minor page faults since the fork (copy-on-write among them).",
        lambda w: w.memory.minflt if w.memory else None,
    )
