"""The monitor's decisions about molds: which one is current, and where the next one comes from.

A mold comes from a fresh import (the first start, HUP, a mold crash) or from a promoted worker
(`--refork-after`, USR2, or a worker needed while the mold was stopped by `--mold-idle-exit`).
This is a part of the Monitor class, kept in its own file; the process itself is refork.process.mold.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from refork.config import Config, ConfigError, reloaded
from refork.process import messages
from refork.process.context import ProcessContext
from refork.process.forking import backoff_delay
from refork.process.roster import Child, Roster
from refork.process.watch import Watcher

log = logging.getLogger("refork")


class MoldPolicy:
    """Mixed into Monitor: starting, promoting, adopting, shedding and replacing molds."""

    config: Config
    ctx: ProcessContext
    roster: Roster
    reread: Callable[[], Config] | None
    target_workers: int
    stopping: str | None
    exit_code: int
    generation: int  # of the current mold; workers of older generations are rolled out
    started: bool  # the first mold became ready
    mold_crashes: int  # consecutive unexpected mold deaths
    next_mold_at: float  # back-off before the next fresh mold
    rollout_limit: int  # outdated workers replaced at once
    mold_shed: bool  # the mold was stopped on purpose (--mold-idle-exit)
    mold_busy_at: float  # the mold's last spawn request or readiness
    watcher: Watcher | None  # --reload

    if TYPE_CHECKING:  # provided by Monitor

        def spawn_mold(self, generation: int, config: Config | None = None) -> None: ...
        def set_worker_count(self, count: int) -> None: ...
        def begin_stop(self, mode: str) -> None: ...
        def _command(self, child: Child, message: object) -> bool: ...
        def _stop_child(self, child: Child, graceful: bool) -> None: ...
        def _serving_workers(self) -> list[Child]: ...
        def _rollout_in_progress(self) -> bool: ...
        def _workers_wanted(self) -> bool: ...
        def _run_hook(self, name: str, config: Config, *extra: object) -> None: ...

    # -- a fresh import: HUP, a crash ------------------------------------------------------------
    def reload(self) -> str | None:
        """HUP: re-read the config, start a new mold from a fresh import, replace workers one at a time.

        The new config takes effect when the new mold is ready; if it fails, nothing changed.
        Returns why no reload was started, or None.
        """
        if self.roster.pending_mold() is not None:
            log.info("reload ignored: a new mold is already starting")
            return "a new mold is already starting; try again when `refork status` shows it ready"
        try:
            config = self._reread_config()
        except ConfigError as e:
            log.error("reload: %s; nothing changed", e)
            return f"{e}; nothing changed"
        self._run_hook("on_reload", config)
        log.info("reload: starting a new mold (gen %d) from a fresh import", self.generation + 1)
        self.rollout_limit = 1
        self.spawn_mold(self.generation + 1, config)
        return None

    def _reload_on_edits(self, now: float) -> None:
        """--reload: a changed *.py file reloads like HUP; edits made during a reload wait for it."""
        if self.watcher is None or self.roster.pending_mold() is not None:
            return
        edits = self.watcher.poll(now)
        if edits:
            more = f" and {len(edits) - 1} more file(s)" if len(edits) > 1 else ""
            log.info("--reload: %s changed%s", edits[0], more)
            self.reload()

    def _reread_config(self) -> Config:
        """The config as the flags, config file and environment say now; ConfigError if broken."""
        if self.reread is None:
            return self.config
        try:
            fresh = self.reread()
        except ConfigError:
            raise
        except Exception as e:  # the config file is user code: one line, and keep serving
            raise ConfigError(f"the config file raised {type(e).__name__}: {e}") from None
        config, changed, kept = reloaded(self.config, fresh)
        if changed:
            log.info("reload: config changed: %s (applied when the new mold is ready)", ", ".join(changed))
        for name in kept:
            log.warning(
                "reload: %s changed (%r -> %r) but takes a restart; keeping %r",
                name,
                getattr(self.config, name),
                getattr(fresh, name),
                getattr(self.config, name),
            )
        return config

    def _adopt_config(self, config: Config) -> None:
        """The reloaded mold is ready: its config becomes the monitor's and every later child's."""
        previous, self.config = self.config, config
        self.ctx.config = config
        if (config.error_logfile, config.log_level) != (previous.error_logfile, previous.log_level):
            from refork.logs import setup_logging

            setup_logging(config)
        if config.workers != previous.workers:
            self.set_worker_count(config.workers)

    def _keep_a_mold(self, now: float) -> None:
        """No usable mold and none coming: replace a crashed one, or summon a shed one if needed."""
        if (
            not self.started
            or self._usable_mold() is not None
            or self.roster.pending_mold() is not None
            or now < self.next_mold_at
        ):
            return
        if not self.mold_shed:
            self.spawn_mold(self.generation)  # the mold died: a fresh import
        elif self._workers_wanted():
            self._summon_mold()

    # -- promotion: refork -----------------------------------------------------------------------
    def refork_now(self) -> bool:
        """USR2 / `refork refork`: promote the warmest fork-safe worker of the current generation."""
        if not self.ctx.subreaper:
            log.warning("refork unavailable without a child subreaper")
            return False
        if self.roster.pending_mold() is not None:
            log.info("refork ignored: a new mold is already starting")
            return False
        chosen = self._warmest_promotable()
        if chosen is None:
            log.warning("refork: no fork-safe worker of gen %d is ready", self.generation)
            return False
        self._promote(chosen, self.generation + 1)
        return True

    def _promotion_wanted(self, worker: Child) -> None:
        if (
            self.stopping
            or worker.stopping
            or worker.fork_unsafe
            or not worker.ready
            or worker.generation != self.generation
            or self.roster.pending_mold() is not None
            or self._rollout_in_progress()
        ):
            return
        self._promote(worker, self.generation + 1)

    def _warmest_promotable(self) -> Child | None:
        """The ready, fork-safe worker of the current generation that has served the most."""
        candidates = [
            c
            for c in self._serving_workers()
            if c.ready and c.generation == self.generation and not c.fork_unsafe
        ]
        return max(candidates, key=lambda c: self.ctx.slots.requests(c.slot), default=None)

    def _promote(self, worker: Child, generation: int) -> None:
        log.info(
            "promoting worker %d (pid %d, %d requests) to mold of gen %d",
            worker.nr,
            worker.pid,
            self.ctx.slots.requests(worker.slot),
            generation,
        )
        self.roster.expect_mold(generation, promoted_from=worker.pid)
        self._command(worker, messages.Promote(generation))
        self.rollout_limit = self._refork_max_unavailable()

    def _refork_max_unavailable(self) -> int:
        if self.config.refork_max_unavailable:
            return max(1, self.config.refork_max_unavailable)
        return max(1, math.ceil(self.target_workers * 0.1))

    # -- what molds report -----------------------------------------------------------------------
    def _mold_ready(self, mold: Child) -> None:
        previous = self.roster.current_mold()
        self.roster.set_current_mold(mold)
        self.generation = mold.generation
        self.mold_crashes = 0
        self.mold_shed = False
        self.mold_busy_at = time.monotonic()
        if mold.new_config is not None:
            self._adopt_config(mold.new_config)
        log.info("mold (gen %d, pid %d) is the current mold", mold.generation, mold.pid)
        if previous is not None and previous.pid != mold.pid:
            self._stop_child(previous, graceful=True)
        if not self.started:
            self.started = True
            self._run_hook("when_ready", self.config)

    def _mold_failed(self, mold: Child, failure: messages.MoldFailed) -> None:
        mold.failed = failure.reason
        if not self.started:
            self.exit_code = 2 if failure.config_error else 3
            if failure.config_error:
                print(f"refork: error: {failure.reason}", file=sys.stderr, flush=True)
            else:
                log.error("the app failed to load: %s", failure.reason)
            self.begin_stop("fast")
            return
        pending = self.roster.pending_mold()
        source = self.roster.get(pending.promoted_from) if pending and pending.pid == mold.pid else None
        if source is not None:
            source.fork_unsafe = "its promoted mold refused to start (see the log)"
            log.error(
                "worker %d (pid %d) will not be promoted again: its mold (gen %d) refused: %s",
                source.nr,
                source.pid,
                mold.generation,
                failure.reason,
            )
            return
        log.error(
            "new mold (gen %d) failed to load the app: %s; keeping gen %d",
            mold.generation,
            failure.reason,
            self.generation,
        )

    def _mold_exited(self, mold: Child, how: str, expected: bool) -> None:
        if self.roster.current_mold() is None:
            for pending in self.roster.drop_pending_workers():
                self.slot_allocator.give_back(pending.slot)
        if expected or mold.failed:
            log.info("mold (gen %d, pid %d) %s", mold.generation, mold.pid, how)
            return
        log.warning("mold (gen %d, pid %d) %s", mold.generation, mold.pid, how)
        if self.roster.current_mold() is None and self.roster.pending_mold() is None and self.started:
            self.mold_crashes += 1
            delay = backoff_delay(self.mold_crashes) if self.mold_crashes > 1 else 0.0  # first: at once
            self.next_mold_at = time.monotonic() + delay
            log.warning(
                "starting a new mold from a fresh import%s; workers keep serving",
                f" in {delay:.1f}s" if delay else "",
            )

    # -- --mold-idle-exit ------------------------------------------------------------------------
    def _usable_mold(self) -> Child | None:
        mold = self.roster.current_mold()
        return mold if mold is not None and mold.ready and not mold.stopping else None

    def _shed_idle_mold(self, now: float) -> None:
        """--mold-idle-exit: stop a mold with nothing to do, freeing the pages only it still holds.

        Once every worker has copied a page, the mold's original is private to the mold: on 3.11
        that is most of the heap it touched. The next worker needed comes from a promoted worker.
        """
        linger = self.config.mold_idle_exit
        mold = self._usable_mold()
        if linger is None or mold is None or not self.ctx.subreaper or now - self.mold_busy_at < linger:
            return
        if (
            self.roster.pending_mold() is not None
            or self.roster.has_pending_workers()
            or not all(c.ready for c in self.roster.workers())
            or self._workers_wanted()
        ):
            return
        log.info(
            "mold (gen %d, pid %d) idle for %gs; stopping it to free its memory (--mold-idle-exit)",
            mold.generation,
            mold.pid,
            linger,
        )
        self.mold_shed = True
        self._stop_child(mold, graceful=True)

    def _summon_mold(self) -> None:
        """A worker is needed and the mold was shed: promote a warm worker, or import afresh."""
        chosen = self._warmest_promotable() if self.mold_crashes < 2 else None
        if chosen is not None:
            log.info("a worker is needed and the mold was stopped while idle")
            self._promote(chosen, self.generation)
        else:
            log.info("a worker is needed and no worker can be promoted: starting a mold from a fresh import")
            self.spawn_mold(self.generation)
