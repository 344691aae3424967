"""The supervisor's bookkeeping: which children exist, which are expected, which mold is current.

Pure data: no sockets, no clock. Every time is passed in by the supervisor, which has it from
the event it is handling; the monitor keeps each child's command socket itself.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from refork.config import Config, hard_timeout
from refork.memory.accounting import ProcessMemory, format_bytes
from refork.process import messages
from refork.process.supervisor.events import SlotReading

DECLINED_PAUSE = 10.0  # seconds a worker that declined a promotion is not chosen again


@dataclass
class Child:
    pid: int
    role: str  # "mold" | "worker"
    generation: int
    nr: int = -1
    slot: int = -1
    started: float = 0.0
    age: int = 0  # gunicorn's worker.age: the how-manieth worker asked for
    aborted_at: float = 0.0  # sent SIGABRT for --timeout (the hook, the 500); SIGKILL follows
    hung_since: float = 0.0  # past --timeout with app threads beside: draining, killed after it
    ready: bool = False
    ready_at: float = 0.0
    stopping: bool = False
    stop_deadline: float = 0.0
    websockets_until: float = 0.0  # retired with --ws-drain-timeout: it may serve open WebSockets until
    kill_reason: str | None = None
    retire_reason: str | None = None  # set when a replacement must come before it stops
    restart_cause: str | None = None  # why it is replaced: the metrics' cause (see restart_cause())
    nudged: float = 0.0  # the slot deadline it was last sent SIGUSR2 for (--request-timeout)
    fork_unsafe: str | None = None
    declined_at: float = 0.0  # it last found no safe point to be promoted at (PromotionDeclined)
    failed: str | None = None  # why it could not start (StartFailed)
    phase: str = ""  # what it was doing before it was ready (Starting), for the log if it dies
    memory: ProcessMemory | None = None
    memory_at: float = 0.0
    first_private: tuple[int, int] | None = None  # (USS, requests) at its first sample once ready
    new_config: Config | None = None  # a mold started by HUP with a re-read config

    @property
    def label(self) -> str:
        """How the log names it: "worker 3", "mold gen 2"."""
        return f"worker {self.nr}" if self.role == "worker" else f"mold gen {self.generation}"

    def over_memory_limit(self, config: Config) -> str | None:
        """Why this serving worker must be replaced for its memory (--max-worker-memory), or None."""
        limit, metric, mem = config.max_worker_memory, config.memory_metric, self.memory
        if not limit or self.role != "worker" or mem is None or not self.ready or self.stopping:
            return None
        used = mem.pss if metric == "pss" else mem.uss
        if self.retire_reason is not None or used <= limit:
            return None
        return f"{metric.upper()} {format_bytes(used)} over --max-worker-memory {format_bytes(limit)}"

    def private_growth(self, requests: int) -> float | None:
        """Bytes of memory of its own gained per request served since its first sample once
        ready: near 0 when what it holds was copied at its start (a refork shares that again),
        steady when the app keeps memory per request. None until it served 100 more."""
        mem, first = self.memory, self.first_private
        if mem is None or first is None or requests - first[1] < 100:
            return None
        return max(0.0, (mem.uss - first[0]) / (requests - first[1]))

    def status_row(self, requests: int, overdue: int = 0) -> dict[str, Any]:
        """This process as one row of `refork status --json`."""
        mem = self.memory
        return {
            "pid": self.pid,
            "role": self.role,
            "nr": self.nr if self.role == "worker" else None,
            "generation": self.generation,
            "state": "stopping" if self.stopping else ("ready" if self.ready else "starting"),
            "requests": requests,
            "rss": mem.rss if mem else None,
            "pss": mem.pss if mem else None,
            "uss": mem.uss if mem else None,
            "private_dirty": mem.private_dirty if mem else None,
            "shared": mem.rss - mem.uss if mem else None,  # resident and shared with another process
            "private_per_request": self.private_growth(requests),
            "minflt": mem.minflt if mem else None,
            "fork_unsafe": self.fork_unsafe,
            "retiring": self.retire_reason,
            "overdue": overdue,  # requests past --request-timeout still running: hung threads
        }


@dataclass
class PendingMold:
    generation: int
    requested_at: float
    pid: int = 0  # known once the mold reports (or at once, when the monitor forked it)
    promoted_from: int = 0  # the worker's pid, for a promotion
    source_exited_at: float | None = None  # the promoted worker died before its mold reported
    config: Config | None = None  # the re-read config a HUP mold was forked with


@dataclass
class PendingWorker:
    generation: int
    slot: int
    requested_at: float


class Roster:
    def __init__(self) -> None:
        self._children: dict[int, Child] = {}
        self._pending_workers: dict[int, PendingWorker] = {}
        self._pending_mold: PendingMold | None = None
        self._current_mold: int | None = None

    # queries
    def children(self) -> list[Child]:
        return list(self._children.values())

    def workers(self) -> list[Child]:
        return [c for c in self._children.values() if c.role == "worker"]

    def get(self, pid: int) -> Child | None:
        return self._children.get(pid)

    def current_mold(self) -> Child | None:
        return self._children.get(self._current_mold) if self._current_mold else None

    def pending_mold(self) -> PendingMold | None:
        return self._pending_mold

    def spawn_pending(self, nr: int) -> bool:
        return nr in self._pending_workers

    def has_pending_workers(self) -> bool:
        return bool(self._pending_workers)

    def usable_mold(self) -> Child | None:
        """The current mold, if it can fork workers now."""
        mold = self.current_mold()
        return mold if mold is not None and mold.ready and not mold.stopping else None

    def serving_workers(self) -> list[Child]:
        """Workers that are neither stopping nor waiting for their replacement."""
        return [c for c in self.workers() if not c.stopping and c.retire_reason is None]

    def workers_wanted(self, count: int, generation: int) -> bool:
        """Would the mold be asked to fork now: a missing worker, a retiring one, an outdated one?"""
        serving = {c.nr for c in self.serving_workers()}
        return any(nr not in serving for nr in range(count)) or any(
            not c.stopping and (c.retire_reason is not None or c.generation < generation)
            for c in self.workers()
        )

    def overdue(
        self, now: float, slots: Mapping[int, SlotReading], config: Config
    ) -> list[tuple[Child, str]]:
        """Workers past a deadline, with why: busy past --timeout (the slots page says so), not
        ready within --spawn-timeout, or still running --graceful-timeout after Stop (or after
        its last open WebSocket, within --ws-drain-timeout)."""
        found = []
        for child in self.workers():
            if child.kill_reason:
                continue
            if child.hung_since:  # draining (its other requests finish), then killed for its timeout
                if now > child.stop_deadline:
                    found.append((child, f"timeout: busy longer than {config.timeout:g}s, drained for "
                                         f"--graceful-timeout {config.graceful_timeout:g}s"))  # fmt: skip
                continue
            reading = slots.get(child.slot)
            if (
                child.ready
                and reading is not None
                and reading.owner == child.pid
                and reading.deadline
                and now > reading.deadline
            ):
                found.append((child, f"timeout: busy longer than {config.timeout:g}s"))
                continue
            if not child.ready and now - child.started > config.spawn_timeout:
                doing = f" (still {child.phase})" if child.phase else ""
                found.append((child, f"did not become ready within {config.spawn_timeout:g}s{doing}"))
            elif child.stopping and child.stop_deadline and now > child.stop_deadline:
                if now < child.websockets_until and reading is not None and reading.websockets:
                    child.stop_deadline = now + config.graceful_timeout  # counted from their close
                    continue
                found.append((child, f"still running {config.graceful_timeout:g}s after stop"))
        return found

    def blocked_past_soft_deadline(
        self, now: float, slots: Mapping[int, SlotReading], config: Config, grace: float
    ) -> list[tuple[Child, float]]:
        """--request-timeout for a worker whose loop thread is blocked in the app (it cannot look
        itself): the slot deadline is the oldest in-app request's start + --timeout, so that request
        passed the soft deadline `grace` ago and the worker did not report it. Each (worker,
        deadline) once: with the slot deadline it names, to remember."""
        soft = config.request_timeout
        found: list[tuple[Child, float]] = []
        if soft is None:
            return found
        for child in self.workers():
            reading = slots.get(child.slot)
            if (
                not child.ready
                or child.stopping
                or child.kill_reason
                or child.restart_cause == "request_timeout"
                or reading is None
                or reading.owner != child.pid
                or not reading.deadline
                or reading.deadline == child.nudged
            ):
                continue
            if now > reading.deadline - hard_timeout(config) + soft + grace:
                found.append((child, reading.deadline))
        return found

    def rollout_in_progress(self, generation: int) -> bool:
        """A worker of an older generation serves on (one retired serving its WebSockets does not count)."""
        return any(c.generation < generation and not c.websockets_until for c in self.workers())

    def warmest_promotable(
        self, generation: int, slots: Mapping[int, SlotReading], now: float, timeout: float
    ) -> Child | None:
        """The ready, fork-safe, healthy worker of `generation` that has served the most (as `slots`
        say), leaving out one that just declined (a long request kept it from a safe point)."""
        unread = SlotReading(0, 0.0, 0)
        candidates = [
            c
            for c in self.serving_workers()
            if c.ready
            and c.generation == generation
            and not c.fork_unsafe
            and (not c.declined_at or now - c.declined_at >= DECLINED_PAUSE)
            and not c.kill_reason
            and healthy(slots.get(c.slot, unread), now, timeout)
        ]
        return max(candidates, key=lambda c: slots.get(c.slot, unread).requests, default=None)

    # expectations
    def expect_mold(self, generation: int, now: float, promoted_from: int = 0) -> PendingMold:
        self._pending_mold = PendingMold(generation, now, promoted_from=promoted_from)
        return self._pending_mold

    def expect_pid(self, pid: int, now: float) -> Child | None:
        """A mold the monitor forked itself: known before it reports, so an early death is seen."""
        pending = self._pending_mold
        if pending is None:
            return None
        pending.pid = pid
        if pid not in self._children:
            self._children[pid] = Child(pid, "mold", pending.generation, started=now)
        return self._children[pid]

    def clear_pending_mold(self) -> None:
        self._pending_mold = None

    def expect_worker(self, nr: int, generation: int, slot: int, now: float) -> None:
        self._pending_workers[nr] = PendingWorker(generation, slot, now)

    def cancel_spawn(self, nr: int) -> PendingWorker | None:
        return self._pending_workers.pop(nr, None)

    def expired_spawns(self, now: float, timeout: float) -> list[PendingWorker]:
        expired = [nr for nr, p in self._pending_workers.items() if now - p.requested_at > timeout]
        return [self._pending_workers.pop(nr) for nr in expired]

    def drop_pending_workers(self) -> list[PendingWorker]:
        """The mold that was asked to fork these is gone: they will never come."""
        dropped = list(self._pending_workers.values())
        self._pending_workers.clear()
        return dropped

    def set_current_mold(self, mold: Child) -> None:
        self._current_mold = mold.pid
        if self._pending_mold is not None and self._pending_mold.generation == mold.generation:
            self._pending_mold = None

    # events
    def spawned(self, report: messages.Spawned, now: float) -> Child | None:
        """A child reported in; None if it was not expected (stale): it is told nothing and sees EOF."""
        if report.role == "worker":
            pending = self._pending_workers.pop(report.nr, None)
            if pending is None or pending.slot != report.slot:
                return None
            child = Child(report.pid, "worker", report.generation, report.nr, report.slot, started=now,
                          age=report.age)  # fmt: skip
            self._children[report.pid] = child
            return child
        mold = self._children.get(report.pid)
        if mold is None:
            expected = self._pending_mold
            if expected is None or expected.generation != report.generation or expected.pid:
                return None  # stale, or a late orphan of an abandoned promotion
            expected.pid = report.pid
            mold = Child(report.pid, "mold", report.generation, started=now)
            self._children[report.pid] = mold
        return mold

    def exited(self, pid: int) -> Child | None:
        child = self._children.pop(pid, None)
        if child is None:
            return None
        if self._current_mold == pid:
            self._current_mold = None
        if self._pending_mold is not None and self._pending_mold.pid == pid:
            self._pending_mold = None
        return child


def healthy(reading: SlotReading, now: float, timeout: float) -> bool:
    """Could this worker reach a safe point soon? Not with a request past --request-timeout, nor with
    one in the app for more than half of --timeout (`timeout`): it would be killed while promoted,
    or hold the promotion until it declines. The slot deadline is the oldest in-app start (for an
    event loop: its last heartbeat) plus `timeout`."""
    if reading.overdue:
        return False
    if not reading.busy or not reading.deadline:
        return True
    return now - (reading.deadline - timeout) <= timeout / 2


def kill_cause(reason: str) -> str | None:
    """The metrics' cause for a worker killed for a deadline, or None (the kill ends a stop)."""
    return "timeout" if reason.startswith(("timeout", "did not become ready")) else None


def restart_cause(child: Child, server_stopping: bool) -> str | None:
    """Why an exited worker is being replaced, for `refork_worker_restarts_total{cause}`: an open set
    ("crash", "timeout", "memory", "max_requests", "reload", "refork", ...); None when nothing replaces
    it (the server stops, the worker count went down)."""
    if server_stopping or child.role != "worker":
        return None
    if child.kill_reason is not None and kill_cause(child.kill_reason):
        return "timeout"
    if child.stopping:
        return child.restart_cause
    return "crash"


def exit_description(status: int) -> str:
    """A wait status in words, for the log."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by {name}"
    return f"exited with code {os.WEXITSTATUS(status)}"
