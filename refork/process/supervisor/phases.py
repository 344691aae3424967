"""The server's life as the outside world sees it: readiness, reload milestones, and the stop.

Mixed into :class:`refork.process.supervisor.core.Supervisor` (split out by concern; the same pure
transitions: no clock, no OS call). A graceful stop runs in phases: ``--shutdown-delay`` (serving,
readiness off), then the monitor seals and closes its listeners and the molds stop first, then
(once the handshakes under way have landed in the backlog) the workers, which take the backlog as
they stop accepting, then what outlives ``--graceful-timeout`` is killed. docs/deploy.md tells the
user's side.
"""

from __future__ import annotations

from logging import INFO

from refork.config import Config
from refork.process import messages
from refork.process.slots import SlotAllocator
from refork.process.supervisor.events import (
    Action,
    Announce,
    CloseListeners,
    CountHandshakes,
    Exit,
    Milestone,
    Send,
    StopMode,
)
from refork.process.supervisor.roster import Child, Roster

FAST_STOP_TIMEOUT = 1.0  # a fast stop SIGKILLs what is left after this
KILL_RETRY = 5.0  # after the stop deadline's SIGKILLs, how long before trying again
MOLDS_FIRST = 1.0  # a graceful stop waits this long at most for molds to exit before stopping workers
HANDSHAKES_FIRST = 1.0  # and this long at most for handshakes under way on the sealed listeners


class Phases:
    """The Supervisor's readiness and stop transitions (its state is declared here, set there)."""

    config: Config
    roster: Roster
    subreaper: bool
    now: float
    started: bool
    generation: int
    target_workers: int
    slot_allocator: SlotAllocator
    ready: bool
    reloading: bool
    stopping: StopMode | None
    stop_deadline: float
    delay_until: float | None
    workers_stop_at: float
    handshakes_until: float
    exit_code: int
    finished: bool

    def _emit(self, action: Action) -> None:
        raise NotImplementedError

    def _log(self, level: int, text: str, *args: object) -> None:
        raise NotImplementedError

    def _kill(self, child: Child, reason: str) -> None:
        raise NotImplementedError

    # -- readiness and reloads -------------------------------------------------------------------
    def _announce(self, milestone: Milestone) -> None:
        self._emit(Announce(milestone))

    def _milestones(self) -> None:
        """Readiness (--ready-when) once; READY again after a reload's RELOADING, however it ended."""
        if not self.ready and self.started and self.delay_until is None:
            up = [c for c in self.roster.workers() if c.ready and not c.stopping]
            if self.config.ready_when == "started":
                met = bool(up)
            else:
                met = len({c.nr for c in up if c.generation == self.generation}) >= self.target_workers
            if met:
                self.ready = True
                self._announce("ready")
        if self.reloading and self.roster.pending_mold() is None:
            self.reloading = False
            if self.ready:
                self._announce("reloaded")

    # -- stopping --------------------------------------------------------------------------------
    def _begin_stop(self, mode: StopMode, delayed: bool = False) -> None:
        if self.stopping == "fast" or self.stopping == mode:
            return
        delay = self.config.shutdown_delay
        if self.delay_until is not None and not delayed:  # a second TERM, or INT, during the delay
            self._log(INFO, "%s stop requested during --shutdown-delay: stopping now", mode)
        elif mode == "graceful" and delay > 0 and not delayed and self.stopping is None and self.started:
            self.delay_until = self.now + delay
            self._announce("stopping")
            self._log(INFO, "TERM: serving %gs more with readiness failing (--shutdown-delay)", delay)
            return
        if self.delay_until is None and self.stopping is None:
            self._announce("stopping")
        self.delay_until = None
        self.stopping = mode
        graceful = mode == "graceful"
        timeout = self.config.graceful_timeout if graceful else FAST_STOP_TIMEOUT
        self.stop_deadline = self.now + timeout + (MOLDS_FIRST if graceful else 0.0)
        self.workers_stop_at = self.now + MOLDS_FIRST
        self._log(INFO, "%s stop: %d process(es) to stop", mode, len(self.roster.children()))
        if graceful:
            self.handshakes_until = self.now + HANDSHAKES_FIRST
            self._emit(CloseListeners())
            self._stop_children()
        else:
            self.handshakes_until = 0.0  # nothing waits for the backlog any more
            for child in self.roster.children():
                self._stop_child(child, graceful=False)

    def _handshakes_counted(self, pending: int) -> None:
        if self.handshakes_until and not pending:
            self.handshakes_until = 0.0
            self._stop_children()

    def _stop_children(self) -> None:
        """Stop whatever is not stopping yet. Gracefully, workers go last: they stop accepting
        only once the handshakes under way on the sealed listeners have reached the backlog (or
        after HANDSHAKES_FIRST) and (with a subreaper) no mold holds the listeners (or after
        MOLDS_FIRST), then take the backlog, so no connection queued in the kernel is reset."""
        graceful = self.stopping == "graceful"
        children = self.roster.children()
        if self.handshakes_until and self.now >= self.handshakes_until:
            self._log(INFO, "handshakes still under way after %gs; stopping the workers", HANDSHAKES_FIRST)
            self.handshakes_until = 0.0
        molds_first = (
            self.subreaper and self.now < self.workers_stop_at and any(c.role == "mold" for c in children)
        )
        workers_wait = graceful and (bool(self.handshakes_until) or molds_first)
        for child in children:
            if not child.stopping and not (workers_wait and child.role == "worker"):
                self._stop_child(child, graceful=graceful)

    def _stop_child(self, child: Child, graceful: bool) -> None:
        if child.stopping and graceful:
            return
        child.stopping = True
        child.stop_deadline = self.now + self.config.graceful_timeout
        grace = self._websocket_grace(child) if graceful else 0.0
        if grace:
            child.websockets_until = child.stop_deadline + grace
        self._emit(Send(child.pid, messages.Stop(graceful, grace)))

    def _websocket_grace(self, child: Child) -> float:
        """--ws-drain-timeout for a worker retired once its replacement serves (a reload's take the
        new code at once), while the workers draining leave the slots of the workers and their
        replacements free; 0 otherwise."""
        if self.stopping is not None or child.retire_reason is None or child.restart_cause == "reload":
            return 0.0
        draining = sum(1 for c in self.roster.workers() if c.websockets_until)
        room = min(self.target_workers, self.slot_allocator.capacity - 2 * self.target_workers)
        return self.config.ws_drain_timeout if draining < room else 0.0

    def _stop_step(self) -> None:
        """While stopping: stop latecomers, kill what outlives the deadline, Exit once all are gone."""
        if self.handshakes_until and self.now < self.handshakes_until:
            self._emit(CountHandshakes())
        self._stop_children()
        if not self.roster.children():
            if not self.finished:
                self.finished = True
                self._emit(Exit(self.exit_code))
            return
        if self.now > self.stop_deadline:
            for child in self.roster.children():
                self._kill(child, "did not stop in time")
            self.stop_deadline = self.now + KILL_RETRY
