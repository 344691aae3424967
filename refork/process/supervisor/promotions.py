"""Promotions: a warm worker becomes the next mold (a refork: USR2, `refork refork`,
--refork-after), or the mold of the same generation when the mold was shed (--mold-idle-exit).

A mixin of the Supervisor (pure, like the rest of the core). A promotion is a pending mold the
roster expects from that worker; the worker forks it at its next safe point, or declines
(PromotionDeclined: no safe point within a few seconds), and then the pending mold is forgotten
and that worker is left out of the next choice for a while: a refork asks the next warmest worker
(REFORK_TRIES in all). Only a healthy worker is chosen (roster.healthy: no request near --timeout).
"""

from __future__ import annotations

from collections.abc import Mapping
from logging import INFO, WARNING
from typing import TYPE_CHECKING

from refork.config import Config, hard_timeout, idle_mold_linger
from refork.process import messages
from refork.process.supervisor.backoff import Backoff
from refork.process.supervisor.events import Action, Send, SlotReading
from refork.process.supervisor.rollout import may_promote, rollout_limit
from refork.process.supervisor.roster import Child, Roster

REFORK_TRIES = 3  # workers a refork (USR2, `refork refork`) asks in turn while they decline


class Promotions:
    """The Supervisor's promotions."""

    config: Config
    roster: Roster
    subreaper: bool
    generation: int
    now: float
    slots: Mapping[int, SlotReading]
    target_workers: int
    rollout_limit: int
    mold_shed: bool
    mold_busy_at: float
    mold_crashes: Backoff
    refork_tries: int  # workers the refork under way may still ask (after a decline)
    reforking: bool  # a refork (USR2, `refork refork`) is under way: it says so if it gives up
    _promoted: set[int]

    if TYPE_CHECKING:  # the Supervisor's

        @property
        def reload_possible(self) -> bool: ...

        def _emit(self, action: Action) -> None: ...

        def _log(self, level: int, text: str, *args: object) -> None: ...

        def _requests(self, worker: Child) -> int: ...

        def _spawn_mold(self, generation: int, config: Config | None = None) -> None: ...

        def _stop_child(self, child: Child, graceful: bool) -> None: ...

    # -- promotion: refork -----------------------------------------------------------------------
    def _refork_now(self) -> bool:
        """USR2 / `refork refork`: promote the warmest fork-safe worker of the current generation."""
        if not self.subreaper:
            self._log(WARNING, "refork unavailable without a child subreaper")
            return False
        if self.roster.pending_mold() is not None:
            self._log(INFO, "refork ignored: a new mold is already starting")
            return False
        chosen = self._promotable()
        if chosen is None:
            self._log(WARNING, "refork: no fork-safe worker of gen %d is ready", self.generation)
            return False
        self.refork_tries = REFORK_TRIES - 1
        self.reforking = True
        self._promote(chosen, self.generation + 1)
        return True

    def _promotable(self) -> Child | None:
        """The warmest worker of the current generation that could be promoted now."""
        timeout = hard_timeout(self.config)
        return self.roster.warmest_promotable(self.generation, self.slots, self.now, timeout)

    def _refork_again(self) -> None:
        """A refork's worker declined: ask the next warmest healthy one (the one that declined is
        left out for a while); with none now, each tick looks again."""
        if not self.refork_tries or not self.reload_possible:
            return
        chosen = self._promotable()
        if chosen is not None:
            self.refork_tries -= 1
            self._promote(chosen, self.generation + 1)

    def _promotion_wanted(self, worker: Child) -> None:
        """--refork-after: the worker reached its threshold; promote it unless a refork would overlap."""
        if self.reload_possible and may_promote(worker, self.roster, self.generation):
            self._promote(worker, self.generation + 1)

    def _promotion_declined(self, worker: Child, declined: messages.PromotionDeclined) -> None:
        """The worker found no safe point in time and serves on: its mold is not coming, so a
        reload or the next refork need not wait for it."""
        pending = self.roster.pending_mold()
        if pending is None or pending.promoted_from != worker.pid or pending.pid:
            return
        self.roster.clear_pending_mold()
        self._promoted.discard(declined.generation)
        worker.declined_at = self.now
        self._log(INFO, "worker %d (pid %d) not promoted to mold of gen %d: %s", worker.nr, worker.pid,
                  declined.generation, declined.reason)  # fmt: skip
        if declined.generation <= self.generation:
            return  # a summoned mold (--mold-idle-exit): the next tick summons another
        if self.refork_tries:
            self._log(INFO, "refork: asking another worker")
            self._refork_again()
        elif self.reforking:  # (--refork-after: the worker asks again itself)
            self.reforking = False
            self._log(WARNING, "refork to gen %d given up: no worker reached a safe point in time",
                      declined.generation)  # fmt: skip

    def _promote(self, worker: Child, generation: int) -> None:
        self._log(
            INFO,
            "promoting worker %d (pid %d, %d requests) to mold of gen %d",
            worker.nr,
            worker.pid,
            self._requests(worker),
            generation,
        )
        self.roster.expect_mold(generation, self.now, promoted_from=worker.pid)
        if generation > self.generation:
            self._promoted.add(generation)
        self._emit(Send(worker.pid, messages.Promote(generation)))
        self.rollout_limit = rollout_limit(self.config, self.target_workers)

    # -- --mold-idle-exit ------------------------------------------------------------------------
    def _shed_idle_mold(self, now: float) -> None:
        """Stop a mold with nothing to do, freeing the pages only it still holds.

        Once every worker has copied a page, the mold's original is private to the mold: on 3.11
        that is most of the heap it touched. The next worker needed comes from a promoted worker.
        """
        linger = idle_mold_linger(self.config.mold_idle_exit, self.target_workers)
        mold = self.roster.usable_mold()
        if linger is None or mold is None or not self.subreaper or now - self.mold_busy_at < linger:
            return
        if (
            self.roster.pending_mold() is not None
            or self.roster.has_pending_workers()
            or not all(c.ready for c in self.roster.workers())
            or self.roster.workers_wanted(self.target_workers, self.generation)
        ):
            return
        self._log(
            INFO,
            "mold (gen %d, pid %d) idle for %gs; stopping it to free its memory (--mold-idle-exit)",
            mold.generation,
            mold.pid,
            linger,
        )
        self.mold_shed = True
        self._stop_child(mold, graceful=True)

    def _summon_mold(self) -> None:
        """A worker is needed and the mold was shed: promote a warm worker, or import afresh."""
        chosen = self._promotable() if self.mold_crashes.failures < 2 else None
        if chosen is not None:
            self._log(INFO, "a worker is needed and the mold was stopped while idle")
            self._promote(chosen, self.generation)
        else:
            self._log(
                INFO,
                "a worker is needed and no worker can be promoted: starting a mold from a fresh import",
            )
            self._spawn_mold(self.generation)
