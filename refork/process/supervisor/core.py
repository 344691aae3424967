"""The supervisor core: every decision the monitor makes, as pure transitions.

`Supervisor.handle(event, now)` is the only entry point: it updates the state (the roster, the
crash counters, the generation, the stop) and returns the actions the monitor must carry out,
in order. It never forks, signals, sends, reads a clock or logs: time comes with each call,
the slots page and memory come as readings, log lines leave as Log actions. Like h11's
`_state.py`, so every failure row of docs/architecture.md is a unit test with no process.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from logging import DEBUG, ERROR, INFO, WARNING

from refork.config import Config, reloaded
from refork.memory.accounting import ProcessMemory
from refork.process import messages
from refork.process.slots import SlotAllocator
from refork.process.supervisor.backoff import Backoff
from refork.process.supervisor.events import (
    Action,
    AdoptConfig,
    Boot,
    ChildExited,
    CloseChannel,
    ConfigReread,
    Event,
    FilesChanged,
    ForkMold,
    HandshakesCounted,
    ImmortalizationUnsafe,
    Log,
    MemorySampled,
    MoldForked,
    PrintError,
    ReforkRequested,
    Refused,
    ReleaseSlot,
    ReloadRequested,
    ReopenLogFiles,
    ReopenLogsRequested,
    Report,
    RereadConfig,
    RunHook,
    SampleMemory,
    Send,
    SendFailed,
    SetWorkerCount,
    Signal,
    SlotReading,
    StopMode,
    StopRequested,
    Tick,
)
from refork.process.supervisor.phases import Phases
from refork.process.supervisor.promotions import Promotions
from refork.process.supervisor.rollout import crash_loop_over, recycle, to_retire
from refork.process.supervisor.roster import Child, Roster, exit_description, restart_cause
from refork.process.supervisor.starts import Starts

NUDGE_GRACE = 2.0  # a worker whose loop runs reports --request-timeout itself within a tick (1s)
ABORT_GRACE = 1.0  # after a timeout's SIGABRT (the hook, the 500), seconds before SIGKILL
REPORT_GRACE = 2.0  # seconds for a promoted mold to report once the worker that forked it died
REFUSED_REFORK = "no promotable worker (see the log)"


class Supervisor(Phases, Starts, Promotions):
    """The monitor's state and decisions. Construct, feed `Boot()`, then every event as it comes."""

    def __init__(self, config: Config, *, subreaper: bool, capacity: int, python: str = "") -> None:
        self.config = config
        self.python = python  # the interpreter's version, for the immortalization fallback's warning
        self.subreaper = subreaper
        self.roster = Roster()
        self.slot_allocator = SlotAllocator(capacity)
        self.target_workers = config.workers
        self.worker_age = 0  # workers asked for so far: each one's `age` (gunicorn's hooks read it)
        self.generation = 0  # of the current mold; workers of older generations are rolled out
        self.started = False  # the first mold became ready
        self.stopping: StopMode | None = None
        self.stop_deadline = 0.0
        self.exit_code = 0
        self.finished = False  # Exit was returned
        self.worker_crashes = Backoff()  # workers dying early, in a row
        self.mold_crashes = Backoff(first_free=True)  # molds dying unexpectedly, in a row
        self.last_memory_sample = float("-inf")
        self.slots: Mapping[int, SlotReading] = {}  # the slots page as last read
        self.rollout_limit = 1  # outdated workers replaced at once
        self.mold_shed = False  # the mold was stopped on purpose (--mold-idle-exit)
        self.mold_busy_at = 0.0  # the mold's last spawn request or readiness
        self.now = 0.0
        self.ready = False  # --ready-when was met (announced once)
        self.reloading = False  # RELOADING was announced; READY follows when no new mold is pending
        self.delay_until: float | None = None  # a TERM's --shutdown-delay runs until then
        self.handshakes_until = 0.0  # while set, a graceful stop waits for handshakes under way
        self.workers_stop_at = 0.0  # a graceful stop stops workers once molds are gone, or from then
        self._actions: list[Action] = []
        self.restarts: dict[str, int] = {}  # workers replaced, by cause (the metrics)
        self._promoted: set[int] = set()  # generations whose mold is a promoted worker (reforks)
        self.refork_tries = 0  # workers the refork under way may still ask, should one decline
        self.reforking = False  # a refork asked by USR2 / `refork refork` is under way
        self.reload_queued = False  # a reload asked while a new mold was starting: it follows it

    # -- the entry point -------------------------------------------------------------------------
    @property
    def reload_possible(self) -> bool:
        """Would a reload start now? (--reload's watcher waits while not: edits then are kept.)"""
        return not self.stopping and self.delay_until is None and self.roster.pending_mold() is None

    def handle(self, event: Event, now: float) -> list[Action]:
        """Apply one event at monotonic time `now`; return what must be done, in order."""
        self.now = now
        self._actions = []
        self._dispatch(event)
        actions, self._actions = self._actions, []
        return actions

    def _dispatch(self, event: Event) -> None:
        if isinstance(event, Tick):
            self.slots = event.slots
            if self.stopping:
                self._stop_step()
            else:
                self._supervise()
                if self.delay_until is not None and self.now >= self.delay_until:
                    self._begin_stop("graceful", delayed=True)
        elif isinstance(event, messages.Spawned):
            self._spawned(event)
        elif isinstance(event, ChildExited):
            self._child_exited(event.pid, event.status)
        elif isinstance(event, MoldForked):
            self._mold_forked(event.pid)
        elif isinstance(event, SendFailed):
            self._send_failed(event.pid, event.message)
        elif isinstance(event, StopRequested):
            self._begin_stop(event.mode)
        elif isinstance(event, ReloadRequested):
            self._reload_requested()
        elif isinstance(event, ConfigReread):
            self._config_reread(event)
        elif isinstance(event, FilesChanged):
            self._files_changed(event.paths)
        elif isinstance(event, ReforkRequested):
            self.slots = event.slots
            if not self._refork_now():
                self._emit(Refused(REFUSED_REFORK))
        elif isinstance(event, ReopenLogsRequested):
            self._emit(ReopenLogFiles())
            for child in self.roster.children():
                self._emit(Send(child.pid, messages.ReopenLogs()))
        elif isinstance(event, SetWorkerCount):
            self._set_worker_count(event.count)
        elif isinstance(event, MemorySampled):
            self._memory_sampled(event.readings, event.check_limit)
        elif isinstance(event, HandshakesCounted):
            self._handshakes_counted(event.pending)
        elif isinstance(event, Boot):
            self._hook("nworkers_changed", self.config, self.target_workers, None)
            self._spawn_mold(self.generation)
        elif isinstance(event, ImmortalizationUnsafe):
            self._immortalization_unsafe(event.detail)
        else:
            self._report(event)

    # -- output ----------------------------------------------------------------------------------
    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _log(self, level: int, text: str, *args: object) -> None:
        self._emit(Log(level, text % args if args else text))

    def _hook(self, name: str, config: Config, *extra: object) -> None:
        if name in config.hooks:
            self._emit(RunHook(name, config, extra))

    # -- reports from children -------------------------------------------------------------------
    def _spawned(self, report: messages.Spawned) -> None:
        child = self.roster.spawned(report, self.now)
        if child is None:
            self._emit(CloseChannel(report.pid))
        elif child.role == "worker":
            self._log(DEBUG, "worker %d spawned (pid %d, gen %d)", child.nr, child.pid, child.generation)

    def _report(self, message: Report) -> None:
        child = self.roster.get(message.pid)
        if child is None or isinstance(message, messages.Spawned):
            return
        if isinstance(message, messages.Ready):
            child.ready = True
            child.ready_at = self.now
            self._started(child, message)
            if child.role == "mold":
                self._mold_ready(child)
            else:
                self._log(INFO, "worker %d ready (pid %d, gen %d)", child.nr, child.pid, child.generation)
        elif isinstance(message, messages.Starting):
            self._starting(child, message)
        elif isinstance(message, messages.StartFailed):
            self._start_failed(child, message)
            if child.role == "mold":
                self._mold_failed(child, message)
        elif isinstance(message, messages.WantsRetirement):
            if not child.stopping and child.retire_reason is None:
                self._log(INFO, "worker %d (pid %d) %s; replacing it", child.nr, child.pid, message.reason)
                child.retire_reason = message.reason
                child.restart_cause = message.cause  # also: no more SIGUSR2 nudges (request_timeout)
        elif isinstance(message, messages.WantsPromotion):
            self._promotion_wanted(child)
        elif isinstance(message, messages.PromotionDeclined):
            self._promotion_declined(child, message)
        else:
            child.fork_unsafe = message.reason
            self._log(INFO, "worker %d (pid %d) is fork-unsafe: %s", child.nr, child.pid, message.reason)

    def _send_failed(self, pid: int, message: object) -> None:
        """An undeliverable SpawnWorker is given back; an undeliverable Stop becomes a signal."""
        if isinstance(message, messages.SpawnWorker):
            pending = self.roster.cancel_spawn(message.nr)
            if pending is not None:
                self.slot_allocator.give_back(pending.slot)
        elif isinstance(message, messages.Stop):
            self._emit(Signal(pid, signal.SIGTERM if message.graceful else signal.SIGKILL))

    # -- exits -----------------------------------------------------------------------------------
    def _child_exited(self, pid: int, status: int) -> None:
        child = self.roster.exited(pid)
        if child is None:
            return
        self._emit(CloseChannel(pid))
        pending = self.roster.pending_mold()
        if pending is not None and pending.promoted_from == pid and not pending.pid:
            pending.source_exited_at = self.now  # its mold may or may not have been forked
        if child.slot >= 0:
            self._emit(ReleaseSlot(child.slot))
            self.slot_allocator.give_back(child.slot)
        lived = self.now - child.started
        how = exit_description(status)
        expected = child.stopping or bool(self.stopping)
        if child.role == "mold":
            self._mold_exited(child, how, expected, status, lived)
        else:
            level = INFO if expected else WARNING
            reason = f" ({child.kill_reason})" if child.kill_reason else ""
            self._log(
                level, "worker %d (pid %d, gen %d) %s%s", child.nr, child.pid, child.generation, how, reason
            )
            early_crash = not expected and child.kill_reason is None and (not child.ready or lived < 1.0)
            if early_crash and not self._of_abandoned_heap(child, status):
                self._crash_backoff(f"worker {child.nr} {how} {lived:.1f}s after start")
                self._crash_at_start(child, status, lived)
        cause = restart_cause(child, bool(self.stopping))
        if cause is not None:
            self.restarts[cause] = self.restarts.get(cause, 0) + 1
        info = {"pid": pid, "role": child.role, "nr": child.nr, "generation": child.generation,
                "age": child.age, "status": status}  # fmt: skip
        self._hook("child_exit", self.config, info)

    def _crash_backoff(self, why: str) -> None:
        delay = self.worker_crashes.failed(self.now)
        failures = self.worker_crashes.failures
        self._log(WARNING, "crash loop: %s; next worker in %.1fs (failure %d in a row)", why, delay, failures)

    # -- supervision: one pass per tick ----------------------------------------------------------
    def _supervise(self) -> None:
        now = self.now
        self._enforce_deadlines(now)
        self._keep_a_mold(now)
        self._end_crash_loop(now)
        self._keep_worker_count(now)
        self._rollout()
        self._recycle(now)
        self._shed_idle_mold(now)
        self._refork_again()
        self._start_queued_reload()
        self._schedule_memory_sample(now)
        self._milestones()

    def _enforce_deadlines(self, now: float) -> None:
        timeout = self.config.spawn_timeout
        for pending in self.roster.expired_spawns(now, timeout):
            self._log(WARNING, "a worker asked of the mold did not report within %gs", timeout)
            self.slot_allocator.give_back(pending.slot)
        for child, reason in self.roster.overdue(now, self.slots, self.config):
            if self._drains_before_kill(child, reason):
                self._drain_hung(child, reason)
            else:
                self._kill(child, reason)
        for child in self.roster.workers():
            if child.aborted_at and now > child.aborted_at + ABORT_GRACE:
                child.aborted_at = 0.0
                self._emit(Signal(child.pid, signal.SIGKILL))
        blocked = self.roster.blocked_past_soft_deadline(now, self.slots, self.config, NUDGE_GRACE)
        for child, deadline in blocked:
            child.nudged = deadline  # once per request holding the deadline
            self._log(DEBUG, "worker %d (pid %d): --request-timeout passed unreported: SIGUSR2", child.nr,
                      child.pid)  # fmt: skip
            self._emit(Signal(child.pid, signal.SIGUSR2))
        pending_mold = self.roster.pending_mold()
        orphaned_at = pending_mold.source_exited_at if pending_mold is not None else None
        if pending_mold is not None and orphaned_at is not None and now > orphaned_at + REPORT_GRACE:
            self._log(
                WARNING,
                "worker (pid %d) died while being promoted; mold of gen %d abandoned",
                pending_mold.promoted_from,
                pending_mold.generation,
            )
            self.roster.clear_pending_mold()  # a missing mold is replaced; the next refork may start
        elif pending_mold is not None and now - pending_mold.requested_at > timeout + 60:
            mold = self.roster.get(pending_mold.pid) if pending_mold.pid else None
            gen = pending_mold.generation
            self._log(WARNING, "new mold (gen %d) did not become ready in time; giving up", gen)
            if mold is not None:
                self._kill(mold, "mold spawn timeout")
            self.roster.clear_pending_mold()

    def _drains_before_kill(self, child: Child, reason: str) -> bool:
        """A worker past --timeout with app threads (--threads > 1): its loop thread is not the one
        stuck, so it can drain; a single-threaded or ASGI worker's passed deadline is its loop stuck."""
        reading = self.slots.get(child.slot)
        return (
            reason.startswith("timeout")
            and not child.stopping
            and reading is not None
            and reading.threads > 1
            and self.config.graceful_timeout > 0
        )

    def _drain_hung(self, child: Child, reason: str) -> None:
        """The hung request costs only itself: the worker stops accepting (its replacement is asked
        for at once: it no longer serves), its other requests finish within --graceful-timeout, and
        then it is killed (roster.overdue)."""
        self._log(WARNING, "%s (pid %d): %s; draining it: its other requests have --graceful-timeout "
                  "(%gs), then it is killed", child.label, child.pid, reason,
                  self.config.graceful_timeout)  # fmt: skip
        child.hung_since = self.now
        child.restart_cause = "timeout"
        self._stop_child(child, graceful=True)

    def _kill(self, child: Child, reason: str) -> None:
        child.kill_reason = reason
        if reason.startswith("timeout") and child.role == "worker":
            # gunicorn's way: on SIGABRT the worker runs the worker_abort hook and answers the request
            # blocked in the app with a 500 (refork.process.worker); SIGKILL follows a second later
            self._log(WARNING, "%s (pid %d): %s; aborting it (SIGABRT)", child.label, child.pid, reason)
            child.aborted_at = self.now
            self._emit(Signal(child.pid, signal.SIGABRT))
            return
        self._log(WARNING, "%s (pid %d): %s; killing it", child.label, child.pid, reason)
        self._emit(Signal(child.pid, signal.SIGKILL))

    def _end_crash_loop(self, now: float) -> None:
        if crash_loop_over(self.roster.workers(), self.worker_crashes, now):
            self.worker_crashes.reset()

    def _keep_worker_count(self, now: float) -> None:
        serving = self.roster.serving_workers()
        for child in serving:
            if child.nr >= self.target_workers:
                self._stop_child(child, graceful=True)
        mold = self.roster.usable_mold()
        if mold is None or now < self.worker_crashes.next_at:
            return
        serving_nrs = {c.nr for c in serving}
        for nr in range(self.target_workers):
            if nr not in serving_nrs and not self.roster.spawn_pending(nr):
                self._spawn_worker(mold, nr)

    def _spawn_worker(self, mold: Child, nr: int) -> None:
        slot = self.slot_allocator.take()
        self.mold_busy_at = self.now
        self.roster.expect_worker(nr, mold.generation, slot, self.now)
        self.worker_age += 1
        self._emit(Send(mold.pid, messages.SpawnWorker(nr, mold.generation, slot, self.worker_age)))

    def _rollout(self) -> None:
        """Replace workers of older generations, at most rollout_limit at a time."""
        if self.roster.usable_mold() is None:
            return
        cause = "refork" if self.generation in self._promoted else "reload"
        for child in to_retire(self.roster.workers(), self.generation, self.rollout_limit):
            child.retire_reason = f"replaced by gen {self.generation}"
            child.restart_cause = cause

    def _recycle(self, now: float) -> None:
        """A retiring worker stops once its replacement (same nr) is ready."""
        mold = self.roster.usable_mold()
        for child, replaced in recycle(self.roster, mold is not None and now >= self.worker_crashes.next_at):
            if replaced:
                self._stop_child(child, graceful=True)
            elif mold is not None:
                self._spawn_worker(mold, child.nr)

    # -- memory ----------------------------------------------------------------------------------
    def _schedule_memory_sample(self, now: float) -> None:
        """Ask for smaps_rollup of every child at most once per --memory-interval."""
        if now - self.last_memory_sample < self.config.memory_interval:
            return
        self.last_memory_sample = now
        pids = tuple(c.pid for c in self.roster.children())
        if pids:
            self._emit(SampleMemory(pids))

    def _memory_sampled(self, readings: Mapping[int, ProcessMemory | None], check_limit: bool) -> None:
        for pid, memory in readings.items():
            child = self.roster.get(pid)
            if child is None:
                continue
            child.memory, child.memory_at = memory, self.now
            if memory is not None and child.ready and child.first_private is None and child.role == "worker":
                child.first_private = (memory.uss, self._requests(child))
            over = child.over_memory_limit(self.config) if check_limit else None
            if over is not None:
                self._log(WARNING, "worker %d (pid %d): %s; replacing it", child.nr, child.pid, over)
                child.retire_reason = over
                child.restart_cause = "memory"

    # -- worker count ----------------------------------------------------------------------------
    def _set_worker_count(self, count: int, reloaded: bool = False) -> None:
        """The worker count set (TTIN/TTOU, `refork ttin`, a reload): nworkers_changed is called
        when it changed, and on every reload, as gunicorn sets it again then (old == new)."""
        most = self.slot_allocator.capacity // 2  # a replacement and the worker it replaces
        if count > most:
            self._log(WARNING, "at most %d workers for this monitor (restart with -w to go higher)", most)
        old, self.target_workers = self.target_workers, max(1, min(count, most))
        if self.target_workers != old:
            self._log(INFO, "worker count is now %d", self.target_workers)
        if self.target_workers != old or reloaded:
            self._hook("nworkers_changed", self.config, self.target_workers, old)

    # -- molds: a fresh import (the start, HUP, a crash) -----------------------------------------
    def _spawn_mold(self, generation: int, config: Config | None = None) -> None:
        """Ask for a fresh mold (it imports the app), with a reloaded config if given."""
        if config is not None:
            config = self._without_immortalization(config)
        pending = self.roster.expect_mold(generation, self.now)
        pending.config = config if config is not None and config is not self.config else None
        self._emit(ForkMold(generation, pending.config))

    def _requests(self, worker: Child) -> int:
        reading = self.slots.get(worker.slot)
        return reading.requests if reading is not None else 0

    def _mold_forked(self, pid: int) -> None:
        pending = self.roster.pending_mold()
        mold = self.roster.expect_pid(pid, self.now)
        if mold is not None and pending is not None:
            mold.new_config = pending.config

    def _keep_a_mold(self, now: float) -> None:
        """No usable mold and none coming: replace a crashed one, or summon a shed one if needed."""
        if (
            self.roster.usable_mold() is not None
            or self.roster.pending_mold() is not None
            or now < self.mold_crashes.next_at
        ):
            return
        if not self.mold_shed:
            self._spawn_mold(self.generation)  # the mold died: a fresh import
        elif self.roster.workers_wanted(self.target_workers, self.generation):
            self._summon_mold()

    # -- reloads: HUP, `refork reload`, --reload -------------------------------------------------
    def _reload_requested(self) -> None:
        """The new config takes effect when the new mold is ready; if it fails, nothing changed."""
        if self.stopping or self.delay_until is not None:
            self._emit(Refused("the server is stopping"))
        elif (pending := self.roster.pending_mold()) is not None:
            # a refork (or another reload) is starting its mold: this reload follows it, never lost
            if not self.reload_queued:
                gen = pending.generation
                self._log(INFO, "reload: starts once the mold of gen %d now starting is ready", gen)
            self.reload_queued = True
        else:
            self._emit(RereadConfig())

    def _start_queued_reload(self) -> None:
        if self.reload_queued and self.reload_possible:
            self.reload_queued = False
            self._log(INFO, "reload: the mold it waited for is ready; reloading")
            self._emit(RereadConfig())

    def _config_reread(self, reread: ConfigReread) -> None:
        if reread.error is not None:
            self._log(ERROR, "reload: %s; nothing changed", reread.error)
            self._emit(Refused(f"{reread.error}; nothing changed"))
            return
        config = self.config
        if reread.config is not None:
            config, changed, kept = reloaded(self.config, reread.config)
            if changed:
                self._log(
                    INFO,
                    "reload: config changed: %s (applied when the new mold is ready)",
                    ", ".join(changed),
                )
            for name in kept:
                was, wanted = getattr(self.config, name), getattr(reread.config, name)
                self._log(
                    WARNING,
                    f"reload: {name} changed ({was!r} -> {wanted!r}) but takes a restart; keeping {was!r}",
                )
        self._hook("on_reload", config)
        self._log(INFO, "reload: starting a new mold (gen %d) from a fresh import", self.generation + 1)
        self.reloading = True
        self._announce("reloading")
        self.rollout_limit = 1
        self._spawn_mold(self.generation + 1, config)

    def _files_changed(self, paths: tuple[str, ...]) -> None:
        """--reload: an edit reloads like HUP; edits made during a reload or a stop are dropped."""
        if not paths or not self.reload_possible:
            return
        more = f" and {len(paths) - 1} more file(s)" if len(paths) > 1 else ""
        self._log(INFO, "--reload: %s changed%s", paths[0], more)
        self._reload_requested()

    def _adopt_config(self, config: Config) -> None:
        """The reloaded mold is ready: its config becomes the monitor's and every later child's."""
        previous, self.config = self.config, config
        self._emit(AdoptConfig(config))
        self._set_worker_count(config.workers if config.workers != previous.workers else self.target_workers,
                               reloaded=True)  # fmt: skip

    # -- what molds report -----------------------------------------------------------------------
    def _mold_ready(self, mold: Child) -> None:
        previous = self.roster.current_mold()
        self.roster.set_current_mold(mold)
        self.generation = mold.generation
        self.refork_tries, self.reforking = 0, False
        self.mold_crashes.reset()
        self.mold_shed = False
        self.mold_busy_at = self.now
        if mold.new_config is not None:
            self._adopt_config(mold.new_config)
        self._log(INFO, "mold (gen %d, pid %d) is the current mold", mold.generation, mold.pid)
        if previous is not None and previous.pid != mold.pid:
            self._stop_child(previous, graceful=True)
        if not self.started:
            self.started = True
            self._hook("when_ready", self.config)

    def _mold_failed(self, mold: Child, failure: messages.StartFailed) -> None:
        if not self.started:
            if failure.config_error:
                self.exit_code = 2
                self._emit(PrintError(f"refork: error: {failure.reason}"))
                self._begin_stop("fast")
            else:
                self._give_up(f"the mold (gen {mold.generation}) {self._how(mold, 0)}")
            return
        pending = self.roster.pending_mold()
        if pending is None or pending.pid != mold.pid:
            return
        self.roster.clear_pending_mold()  # it is done for, even before it exits: a reload may start
        source = self.roster.get(pending.promoted_from)
        if source is not None:
            source.fork_unsafe = "its promoted mold refused to start (see the log)"
            self._log(
                ERROR,
                "worker %d (pid %d) will not be promoted again: its mold (gen %d) refused: %s",
                source.nr,
                source.pid,
                mold.generation,
                failure.reason,
            )
            return
        self._log(
            ERROR,
            "new mold (gen %d) failed to load the app: %s; keeping gen %d",
            mold.generation,
            failure.reason,
            self.generation,
        )

    def _mold_exited(self, mold: Child, how: str, expected: bool, status: int, lived: float) -> None:
        if self.roster.current_mold() is None:
            for pending in self.roster.drop_pending_workers():
                self.slot_allocator.give_back(pending.slot)
        if expected:
            self._log(INFO, "mold (gen %d, pid %d) %s", mold.generation, mold.pid, how)
            return
        level = INFO if mold.failed else WARNING
        self._log(level, "mold (gen %d, pid %d) %s", mold.generation, mold.pid, how)
        if self._crash_at_start(mold, status, lived) or mold.failed:
            return
        if self.roster.current_mold() is None and self.roster.pending_mold() is None:
            delay = self.mold_crashes.failed(self.now)
            self._log(
                WARNING,
                "starting a new mold from a fresh import%s; workers keep serving",
                f" in {delay:.1f}s" if delay else "",
            )
