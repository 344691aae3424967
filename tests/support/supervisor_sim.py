"""A pretend monitor for the supervisor core: it plays the children's part with no process.

`Sim` feeds events to refork.process.supervisor.core.Supervisor at a clock it controls and keeps
what the core asked for, so tests read as "this happened, so the core asked for that".
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from typing import Any, TypeVar

from refork.config import Config
from refork.process import messages
from refork.process.supervisor.core import Supervisor
from refork.process.supervisor.events import (
    Action,
    Boot,
    ChildExited,
    CloseListeners,
    ConfigReread,
    CountHandshakes,
    Event,
    ForkMold,
    HandshakesCounted,
    Log,
    MoldForked,
    ReloadRequested,
    RereadConfig,
    Send,
    SlotReading,
    Tick,
)

A = TypeVar("A")
KILLED = signal.SIGKILL  # a wait status for "was killed by SIGKILL"
EXIT_1 = 1 << 8  # a wait status for "exited with code 1"
CLEAN = 0


def config(**overrides: Any) -> Config:
    """A config with one generation and its mold kept, unless a test names the policy it studies."""
    pinned: dict[str, Any] = {"refork_after": None, "mold_idle_exit": None}
    return replace(Config(app="app:app", workers=2), **{**pinned, **overrides})


class Sim:
    def __init__(self, subreaper: bool = True, capacity: int | None = None, **overrides: Any) -> None:
        self.config = config(**overrides)
        capacity = capacity or max(16, 4 * self.config.workers)  # the monitor's: max(256, 4 * workers)
        self.sup = Supervisor(self.config, subreaper=subreaper, capacity=capacity)
        self.now = 1000.0
        self.pids = iter(range(2000, 1_000_000))
        self.slots: dict[int, SlotReading] = {}  # what the slots page says, by slot
        self.actions: list[Action] = []  # everything asked for, in order
        self.handshakes = 0  # TCP handshakes under way on the sealed listeners, as the monitor counts them

    # -- feeding ---------------------------------------------------------------------------------
    def handle(self, event: Event, after: float = 0.0) -> list[Action]:
        """Like the monitor's feed(): the actions, then those of the answers the monitor gives."""
        self.now += after
        actions = self.sup.handle(event, self.now)
        self.actions += actions
        for action in list(actions):
            if isinstance(action, CloseListeners | CountHandshakes):
                actions += self.handle(HandshakesCounted(self.handshakes))
        return actions

    def tick(self, after: float = 0.0) -> list[Action]:
        readings = {
            c.slot: self.slots.get(c.slot, SlotReading(c.pid, 0.0, 0)) for c in self.sup.roster.workers()
        }
        return self.handle(Tick(readings), after)

    def exit(self, pid: int, status: int = EXIT_1, after: float = 0.0) -> list[Action]:
        return self.handle(ChildExited(pid, status), after)

    # -- the children's part ---------------------------------------------------------------------
    def fork_mold(self, actions: list[Action]) -> int:
        """Carry out the ForkMold in `actions`: the monitor forks, the mold reports in (not ready)."""
        (fork,) = of(actions, ForkMold)
        pid = next(self.pids)
        self.handle(MoldForked(pid))
        self.handle(messages.Spawned("mold", pid, fork.generation))
        return pid

    def boot(self) -> int:
        """Start: the first mold is forked and becomes ready. Returns its pid."""
        mold = self.fork_mold(self.handle(Boot()))
        self.handle(messages.Ready(mold))
        return mold

    def spawn_workers(self, actions: list[Action], ready: bool = True) -> list[int]:
        """Carry out every SpawnWorker in `actions`: the workers report in (and ready)."""
        pids = []
        for send in sends(actions, messages.SpawnWorker):
            order = send.message
            pid = next(self.pids)
            self.slots[order.slot] = SlotReading(pid, 0.0, 0)
            self.handle(messages.Spawned("worker", pid, order.generation, order.nr, order.slot))
            if ready:
                self.handle(messages.Ready(pid))
            pids.append(pid)
        return pids

    def up(self) -> tuple[int, list[int]]:
        """A running server: the mold and `workers` ready workers."""
        mold = self.boot()
        workers = self.spawn_workers(self.tick())
        assert len(workers) == self.config.workers
        return mold, workers

    def worker(self, nr: int) -> int:
        """The pid of the serving worker `nr`."""
        (child,) = [c for c in self.sup.roster.serving_workers() if c.nr == nr]
        return child.pid

    def served(self, pid: int, requests: int) -> None:
        child = self.sup.roster.get(pid)
        assert child is not None
        self.slots[child.slot] = SlotReading(pid, 0.0, requests)


# -- reading actions -----------------------------------------------------------------------------
def of(actions: list[Action], kind: type[A]) -> list[A]:
    return [a for a in actions if isinstance(a, kind)]


def sends(actions: list[Action], kind: type, pid: int | None = None) -> list[Send]:
    """The Send actions carrying a message of `kind` (to `pid`, if given)."""
    return [a for a in of(actions, Send) if isinstance(a.message, kind) and (pid is None or a.pid == pid)]


def logged(actions: list[Action]) -> str:
    """Every Log line, one per line, to search with `in`."""
    return "\n".join(a.text for a in of(actions, Log))


def wait_status(code: int) -> int:
    status = code << 8
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == code
    return status


def reload(sim: Sim, **changes: Any) -> list[Action]:
    """HUP with a config re-read with `changes`; returns the ForkMold actions."""
    assert of(sim.handle(ReloadRequested()), RereadConfig) == [RereadConfig()]
    fresh = replace(sim.config, **changes)
    return sim.handle(ConfigReread(fresh))
