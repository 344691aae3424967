"""The monitor's bookkeeping: which children exist, which are expected, which mold is current."""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, field

from refork.config import Config
from refork.memory.accounting import ProcessMemory
from refork.process import messages


@dataclass
class Child:
    pid: int
    role: str  # "mold" | "worker"
    generation: int
    nr: int = -1
    slot: int = -1
    conn: socket.socket | None = None  # the monitor's end of the child's command socket
    started: float = field(default_factory=time.monotonic)
    ready: bool = False
    ready_at: float = 0.0
    stopping: bool = False
    stop_deadline: float = 0.0
    kill_reason: str | None = None
    retire_reason: str | None = None  # set when a replacement must come before it stops
    fork_unsafe: str | None = None
    failed: str | None = None
    memory: ProcessMemory | None = None
    memory_at: float = 0.0
    new_config: Config | None = None  # a mold started by HUP with a re-read config

    def status_row(self, requests: int) -> dict:
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
            "minflt": mem.minflt if mem else None,
            "fork_unsafe": self.fork_unsafe,
            "retiring": self.retire_reason,
        }


@dataclass
class PendingMold:
    generation: int
    pid: int = 0  # known once the mold reports (or at once, when the monitor forked it)
    promoted_from: int = 0  # the worker's pid, for a promotion
    requested_at: float = field(default_factory=time.monotonic)


@dataclass
class PendingWorker:
    generation: int
    slot: int
    requested_at: float = field(default_factory=time.monotonic)


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

    def command_sockets(self) -> list[socket.socket]:
        return [c.conn for c in self._children.values() if c.conn is not None]

    # expectations
    def expect_mold(self, generation: int, promoted_from: int = 0) -> None:
        self._pending_mold = PendingMold(generation, promoted_from=promoted_from)

    def expect_pid(self, pid: int) -> None:
        """A mold the monitor forked itself: known before it reports, so an early death is seen."""
        pending = self._pending_mold
        if pending is not None and pid not in self._children:
            self._children[pid] = Child(pid, "mold", pending.generation)

    def clear_pending_mold(self) -> None:
        self._pending_mold = None

    def expect_worker(self, nr: int, generation: int, slot: int) -> None:
        self._pending_workers[nr] = PendingWorker(generation, slot)

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
    def spawned(self, report: messages.Spawned, conn: socket.socket | None) -> Child | None:
        if report.role == "worker":
            pending = self._pending_workers.pop(report.nr, None)
            if pending is None or pending.slot != report.slot:
                return None  # not asked for (stale); it will be told nothing and see EOF
            child = Child(report.pid, "worker", report.generation, report.nr, report.slot, conn)
            self._children[report.pid] = child
            return child
        child = self._children.get(report.pid)
        if child is None:
            pending = self._pending_mold
            if pending is None or pending.generation != report.generation:
                return None
            pending.pid = report.pid
            child = Child(report.pid, "mold", report.generation)
            self._children[report.pid] = child
        child.conn = conn
        return child

    def exited(self, pid: int) -> Child | None:
        child = self._children.pop(pid, None)
        if child is None:
            return None
        if child.conn is not None:
            child.conn.close()
            child.conn = None
        if self._current_mold == pid:
            self._current_mold = None
        if self._pending_mold is not None and self._pending_mold.pid == pid:
            self._pending_mold = None
        return child


def exit_description(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"was killed by {name}"
    return f"exited with code {os.WEXITSTATUS(status)}"
