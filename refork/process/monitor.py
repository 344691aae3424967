"""The monitor: the process the user starts. It supervises and never imports the app.

One loop: wait for a signal, a child's report, a control-socket client or the next deadline; then
reap, read reports, and `supervise()`: enforce deadlines, keep the worker count, roll out new
generations, recycle workers, sample memory. Every mold and worker is its direct child (child
subreaper), so it alone reaps and signals them all. Its decisions about molds (reload, refork,
idle exit) are in refork.process.mold_policy.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from refork.config import Config, ConfigError
from refork.memory.accounting import format_bytes, read_memory
from refork.memory.allocator import loaded_allocator
from refork.process import messages
from refork.process.context import ProcessContext, set_title
from refork.process.control import ControlServer
from refork.process.forking import (
    MONITOR_SIGNALS,
    backoff_delay,
    make_subreaper,
    reset_signals_in_child,
    run_child,
)
from refork.process.listeners import bind, describe
from refork.process.mold_policy import MoldPolicy
from refork.process.pidfile import remove_pidfile, write_pidfile
from refork.process.roster import Child, Roster, exit_description
from refork.process.slots import SlotAllocator, Slots
from refork.process.watch import Watcher

log = logging.getLogger("refork")
TICK = 0.25  # the longest the loop sleeps, seconds
STABLE_AFTER = 5.0  # a worker alive this long ends a crash loop
STATUS_FRESHNESS = 1.0  # `refork status` re-reads memory samples older than this


class Monitor(MoldPolicy):
    def __init__(self, config: Config, reread: Callable[[], Config] | None = None) -> None:
        self.config = config
        self.reread = reread  # builds the config again from the same flags, file and environment
        self.roster = Roster()
        self.target_workers = config.workers
        self.generation = 0
        self.stopping: str | None = None  # None | "graceful" | "fast"
        self.stop_deadline = 0.0
        self.exit_code = 0
        self.started = False  # the first mold became ready
        self.signals: deque[int] = deque()
        self.crashes = 0  # consecutive early worker deaths
        self.last_crash_at = 0.0
        self.next_spawn_at = 0.0
        self.mold_crashes = 0
        self.next_mold_at = 0.0
        self.rollout_limit = 1
        self.last_memory_sample = 0.0
        self.mold_shed = False  # the mold was stopped on purpose (--mold-idle-exit)
        self.mold_busy_at = 0.0  # the mold's last spawn request or readiness
        self.watcher: Watcher | None = None  # --reload

    # -- set-up ----------------------------------------------------------------------------------
    def start(self) -> None:
        config = self.config
        set_title(f"{config.proc_name}: monitor")
        if config.pidfile:
            write_pidfile(config.pidfile)
        self._run_hook("on_starting", config)
        subreaper = make_subreaper()
        if not subreaper:
            log.warning("child subreaper unavailable: workers are children of the mold; reforking is off")
            if config.mold_idle_exit is not None:
                log.warning("--mold-idle-exit needs a child subreaper; the mold will stay")
        listeners = bind(config.bind, config.backlog)
        self.report_in, report_out = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.report_in.setblocking(False)
        capacity = max(256, 4 * config.workers)
        self.slot_allocator = SlotAllocator(capacity)
        self.ctx = ProcessContext(config, listeners, report_out, Slots(capacity), subreaper)
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        for sig in MONITOR_SIGNALS:
            signal.signal(sig, self._on_signal)
        self.control = ControlServer.open(config, self)
        for sock in listeners:
            log.info("listening on %s", describe(sock))
        log.info(
            "monitor %d: %d worker(s), %s",
            os.getpid(),
            config.workers,
            "subreaper" if subreaper else "no subreaper",
        )
        if config.reload:
            dirs = config.reload_dirs or [os.path.abspath(d) for d in (os.getcwd(), *config.pythonpath)]
            self.watcher = Watcher(dirs)
            log.info("--reload: watching %d *.py files under %s", len(self.watcher.files), ", ".join(dirs))
        self.spawn_mold(self.generation)

    def _run_hook(self, name: str, config: Config, *extra: object) -> None:
        """A config-file hook in the monitor: its exception is logged, never the monitor's end."""
        hook = config.hooks.get(name)
        if hook is None:
            return
        try:
            hook(config, *extra)
        except Exception:
            log.exception("the %s hook raised; carrying on", name)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> int:
        while True:
            readers = [self.wake_r, self.report_in, *self.control.sockets()]
            try:
                ready, _, _ = select.select(readers, [], [], TICK)
            except InterruptedError:
                ready = []
            if self.wake_r in ready:
                self._drain_wakeups()
            self._handle_signals()
            self._read_reports()
            self._reap()
            for sock in ready:
                if sock in self.control.sockets():
                    self.control.on_readable(sock)
            if self.stopping:
                if self._stop_step():
                    break
            else:
                self.supervise()
        self.shutdown()
        return self.exit_code

    def _drain_wakeups(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    # -- signals ---------------------------------------------------------------------------------
    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.popleft()
            if sig == signal.SIGCHLD:
                continue
            if sig == signal.SIGTERM:
                self.begin_stop("graceful")
            elif sig in (signal.SIGINT, signal.SIGQUIT):
                self.begin_stop("fast")
            elif sig == signal.SIGHUP:
                self.reload()
            elif sig == signal.SIGUSR1:
                self.reopen_logs()
            elif sig == signal.SIGUSR2:
                self.refork_now()
            elif sig == signal.SIGTTIN:
                self.set_worker_count(self.target_workers + 1)
            elif sig == signal.SIGTTOU:
                self.set_worker_count(self.target_workers - 1)

    def set_worker_count(self, count: int) -> None:
        most = self.slot_allocator.capacity // 2  # a replacement and the worker it replaces
        if count > most:
            log.warning("at most %d workers for this monitor (restart with -w to go higher)", most)
        self.target_workers = max(1, min(count, most))
        log.info("worker count is now %d", self.target_workers)

    def reopen_logs(self) -> None:
        from refork.logs import reopen_log_files

        reopen_log_files()
        for child in self.roster.children():
            self._command(child, messages.ReopenLogs())

    def _serving_workers(self) -> list[Child]:
        """Workers that are neither stopping nor waiting for their replacement."""
        return [c for c in self.roster.workers() if not c.stopping and c.retire_reason is None]

    # -- reports from children -------------------------------------------------------------------
    def _read_reports(self) -> None:
        while True:
            try:
                received = messages.receive(self.report_in)
            except (BlockingIOError, InterruptedError):
                return
            if received is None:
                return
            message, attached = received
            self._on_report(message, attached)

    def _on_report(self, message: object, attached: socket.socket | None) -> None:
        roster = self.roster
        if isinstance(message, messages.Spawned):
            child = roster.spawned(message, attached)
            if child is None:
                if attached is not None:
                    attached.close()
                return
            if child.role == "worker":
                log.debug("worker %d spawned (pid %d, gen %d)", child.nr, child.pid, child.generation)
            return
        child = roster.get(getattr(message, "pid", -1))
        if child is None:
            return
        if isinstance(message, messages.Ready):
            child.ready = True
            child.ready_at = time.monotonic()
            if child.role == "mold":
                self._mold_ready(child)
            else:
                log.info("worker %d ready (pid %d, gen %d)", child.nr, child.pid, child.generation)
        elif isinstance(message, messages.MoldFailed):
            self._mold_failed(child, message)
        elif isinstance(message, messages.WantsRetirement):
            if not child.stopping and child.retire_reason is None:
                log.info("worker %d (pid %d) %s; replacing it", child.nr, child.pid, message.reason)
                child.retire_reason = message.reason
        elif isinstance(message, messages.WantsPromotion):
            self._promotion_wanted(child)
        elif isinstance(message, messages.ForkUnsafe):
            child.fork_unsafe = message.reason
            log.info("worker %d (pid %d) is fork-unsafe: %s", child.nr, child.pid, message.reason)
        elif isinstance(message, messages.WorkerExited):
            self._child_exited(message.pid, message.status)

    # -- reaping ---------------------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except InterruptedError:
                continue
            if pid == 0:
                return
            self._child_exited(pid, status)

    def _child_exited(self, pid: int, status: int) -> None:
        child = self.roster.exited(pid)
        if child is None:
            return
        if child.slot >= 0:
            self.ctx.slots.release(child.slot)
            self.slot_allocator.give_back(child.slot)
        lived = time.monotonic() - child.started
        how = exit_description(status)
        expected = child.stopping or self.stopping
        if child.role == "mold":
            self._mold_exited(child, how, expected)
        else:
            level = logging.INFO if expected else logging.WARNING
            reason = f" ({child.kill_reason})" if child.kill_reason else ""
            log.log(
                level, "worker %d (pid %d, gen %d) %s%s", child.nr, child.pid, child.generation, how, reason
            )
            if not expected and child.kill_reason is None and (not child.ready or lived < 1.0):
                self._crash_backoff(f"worker {child.nr} {how} {lived:.1f}s after start")
        info = {"pid": pid, "role": child.role, "nr": child.nr, "status": status}
        self._run_hook("child_exit", self.config, info)

    def _crash_backoff(self, why: str) -> None:
        self.crashes += 1
        self.last_crash_at = time.monotonic()
        delay = backoff_delay(self.crashes)
        self.next_spawn_at = time.monotonic() + delay
        log.warning("crash loop: %s; next worker in %.1fs (failure %d in a row)", why, delay, self.crashes)

    # -- supervision -----------------------------------------------------------------------------
    def supervise(self) -> None:
        now = time.monotonic()
        self._enforce_deadlines(now)
        self._keep_a_mold(now)
        self._reload_on_edits(now)
        self._end_crash_loop(now)
        self._keep_worker_count(now)
        self._rollout(now)
        self._recycle(now)
        self._shed_idle_mold(now)
        self._sample_memory(now)

    def _workers_wanted(self) -> bool:
        """Would the mold be asked to fork now: a missing worker, a retiring one, an outdated one?"""
        serving = {c.nr for c in self._serving_workers()}
        return any(nr not in serving for nr in range(self.target_workers)) or any(
            not c.stopping and (c.retire_reason is not None or c.generation < self.generation)
            for c in self.roster.workers()
        )

    def _enforce_deadlines(self, now: float) -> None:
        slots = self.ctx.slots
        for pending in self.roster.expired_spawns(now, self.config.spawn_timeout):
            log.warning("a worker asked of the mold did not report within %gs", self.config.spawn_timeout)
            self.slot_allocator.give_back(pending.slot)
        for child in self.roster.workers():
            if child.kill_reason:
                continue
            if child.ready and slots.owner(child.slot) == child.pid:
                deadline = slots.deadline(child.slot)
                if deadline and now > deadline:
                    self._kill(child, f"timeout: busy longer than {self.config.timeout:g}s")
                    continue
            if not child.ready and now - child.started > self.config.spawn_timeout:
                self._kill(child, f"did not become ready within {self.config.spawn_timeout:g}s")
            elif child.stopping and child.stop_deadline and now > child.stop_deadline:
                self._kill(child, f"still running {self.config.graceful_timeout:g}s after stop")
        pending = self.roster.pending_mold()
        if pending is not None and now - pending.requested_at > self.config.spawn_timeout + 60:
            child = self.roster.get(pending.pid) if pending.pid else None
            log.warning("new mold (gen %d) did not become ready in time; giving up", pending.generation)
            if child is not None:
                self._kill(child, "mold spawn timeout")
            self.roster.clear_pending_mold()

    def _kill(self, child: Child, reason: str) -> None:
        child.kill_reason = reason
        log.warning(
            "%s %s (pid %d): %s; killing it",
            child.role,
            child.nr if child.role == "worker" else f"gen {child.generation}",
            child.pid,
            reason,
        )
        try:
            os.kill(child.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _end_crash_loop(self, now: float) -> None:
        if self.crashes and any(
            c.ready and now - c.ready_at > STABLE_AFTER and c.started > self.last_crash_at
            for c in self.roster.workers()
        ):
            self.crashes = 0

    def _keep_worker_count(self, now: float) -> None:
        serving = self._serving_workers()
        for child in serving:
            if child.nr >= self.target_workers:
                self._stop_child(child, graceful=True)
        mold = self._usable_mold()
        if mold is None or now < self.next_spawn_at:
            return
        serving_nrs = {c.nr for c in serving}
        for nr in range(self.target_workers):
            if nr not in serving_nrs and not self.roster.spawn_pending(nr):
                self._spawn_worker(mold, nr)

    def _spawn_worker(self, mold: Child, nr: int) -> None:
        slot = self.slot_allocator.take()
        self.mold_busy_at = time.monotonic()
        self.roster.expect_worker(nr, mold.generation, slot)
        if not self._command(mold, messages.SpawnWorker(nr, mold.generation, slot)):
            self.roster.cancel_spawn(nr)
            self.slot_allocator.give_back(slot)

    def _rollout_in_progress(self) -> bool:
        return any(c.generation < self.generation for c in self.roster.workers())

    def _rollout(self, now: float) -> None:
        """Replace workers of older generations, at most rollout_limit at a time."""
        if self._usable_mold() is None:
            return
        outdated = [c for c in self.roster.workers() if c.generation < self.generation and not c.stopping]
        in_transition = sum(1 for c in self.roster.workers() if c.generation < self.generation and c.stopping)
        in_transition += sum(1 for c in outdated if c.retire_reason is not None)
        for child in outdated:
            if child.retire_reason is None and in_transition < self.rollout_limit:
                child.retire_reason = f"replaced by gen {self.generation}"
                in_transition += 1

    def _recycle(self, now: float) -> None:
        """A retiring worker stops once its replacement (same nr) is ready."""
        mold = self._usable_mold()
        for child in list(self.roster.workers()):
            if child.retire_reason is None or child.stopping:
                continue
            replacement = [c for c in self._serving_workers() if c.nr == child.nr]
            if any(c.ready for c in replacement):
                self._stop_child(child, graceful=True)
            elif (
                not replacement
                and not self.roster.spawn_pending(child.nr)
                and mold is not None
                and now >= self.next_spawn_at
            ):
                self._spawn_worker(mold, child.nr)

    def _sample_memory(self, now: float) -> None:
        """Read smaps_rollup for every child at most once per --memory-interval."""
        if now - self.last_memory_sample < self.config.memory_interval:
            return
        self.last_memory_sample = now
        limit = self.config.max_worker_memory
        for child in self.roster.children():
            self._read_memory(child, now)
            if (
                limit
                and child.role == "worker"
                and child.memory is not None
                and child.ready
                and not child.stopping
                and child.retire_reason is None
            ):
                used = child.memory.pss if self.config.memory_metric == "pss" else child.memory.uss
                if used > limit:
                    reason = (
                        f"{self.config.memory_metric.upper()} {format_bytes(used)} over "
                        f"--max-worker-memory {format_bytes(limit)}"
                    )
                    log.warning("worker %d (pid %d): %s; replacing it", child.nr, child.pid, reason)
                    child.retire_reason = reason

    @staticmethod
    def _read_memory(child: Child, now: float) -> None:
        child.memory = read_memory(child.pid)
        child.memory_at = now

    # -- spawning --------------------------------------------------------------------------------
    def spawn_mold(self, generation: int, config: Config | None = None) -> None:
        """Fork a fresh mold (it imports the app), with a reloaded config if given."""
        from refork.process.mold import boot_mold

        self.roster.expect_mold(generation)
        private = [
            self.report_in,
            self.wake_r,
            self.wake_w,
            *self.control.sockets(),
            *self.roster.command_sockets(),
        ]
        reloading = config is not None and config is not self.config
        ctx = replace(self.ctx, config=config) if reloading else self.ctx
        pid = os.fork()
        if pid == 0:
            for sock in private:
                sock.close()
            reset_signals_in_child()
            if reloading:
                from refork.logs import setup_logging

                setup_logging(ctx.config)
            run_child(partial(boot_mold, ctx, generation))
        self.roster.pending_mold().pid = pid  # type: ignore[union-attr]
        self.roster.expect_pid(pid)
        mold = self.roster.get(pid)
        if reloading and mold is not None:
            mold.new_config = config

    def _command(self, child: Child, message: object) -> bool:
        if child.conn is None:
            return False
        try:
            messages.send(child.conn, message)
            return True
        except OSError:
            return False

    # -- stopping --------------------------------------------------------------------------------
    def begin_stop(self, mode: str) -> None:
        if self.stopping == "fast" or self.stopping == mode:
            return
        self.stopping = mode
        timeout = self.config.graceful_timeout if mode == "graceful" else 1.0
        self.stop_deadline = time.monotonic() + timeout
        log.info("%s stop: %d process(es) to stop", mode, len(self.roster.children()))
        for child in self.roster.children():
            self._stop_child(child, graceful=mode == "graceful")

    def _stop_child(self, child: Child, graceful: bool) -> None:
        if child.stopping and graceful:
            return
        child.stopping = True
        child.stop_deadline = time.monotonic() + self.config.graceful_timeout
        if not self._command(child, messages.Stop(graceful)):
            try:
                os.kill(child.pid, signal.SIGTERM if graceful else signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _stop_step(self) -> bool:
        """True once every child is gone."""
        for child in self.roster.children():
            if not child.stopping:
                self._stop_child(child, graceful=self.stopping == "graceful")
        if not self.roster.children():
            return True
        if time.monotonic() > self.stop_deadline:
            for child in self.roster.children():
                self._kill(child, "did not stop in time")
            self.stop_deadline = time.monotonic() + 5.0
        return False

    def shutdown(self) -> None:
        self._run_hook("on_exit", self.config)
        self.control.close()
        for sock in self.ctx.listeners:
            if sock.family == socket.AF_UNIX:
                try:
                    os.unlink(sock.getsockname())
                except OSError:
                    pass
            sock.close()
        if self.config.pidfile:
            remove_pidfile(self.config.pidfile)
        log.info("monitor %d: stopped", os.getpid())

    # -- status ----------------------------------------------------------------------------------
    def status(self) -> dict:
        now = time.monotonic()
        for child in self.roster.children():
            if child.memory is None or now - child.memory_at > STATUS_FRESHNESS:
                self._read_memory(child, now)

        children = sorted(self.roster.children(), key=lambda c: (c.role != "mold", c.generation, c.nr))
        slots = self.ctx.slots
        rows = [c.status_row(slots.requests(c.slot) if c.slot >= 0 else 0) for c in children]
        total_pss = sum(r["pss"] or 0 for r in rows)
        return {
            "monitor_pid": os.getpid(),
            "generation": self.generation,
            "workers": self.target_workers,
            "allocator": loaded_allocator("self"),
            "subreaper": self.ctx.subreaper,
            "refork_pending": self.roster.pending_mold() is not None,
            "mold_idle_exit": self.config.mold_idle_exit,
            "mold_shed": self.mold_shed and self.roster.current_mold() is None,
            "total_pss": total_pss,
            "processes": rows,
        }


def run(config: Config, reread: Callable[[], Config] | None = None) -> int:
    """Run the server until it is stopped; return the exit status. `reread` serves HUP."""
    from refork.logs import setup_logging

    setup_logging(config)
    if config.allocator == "jemalloc":
        from refork.memory.allocator import reexec_with_jemalloc

        reexec_with_jemalloc(sys.argv)
    if config.chdir:
        try:
            os.chdir(config.chdir)
        except OSError as e:
            raise ConfigError(f"--chdir {config.chdir}: {e.strerror}") from None
    monitor = Monitor(config, reread)
    try:
        monitor.start()
    except BaseException:
        if config.pidfile:
            remove_pidfile(config.pidfile)  # only if it was ours
        raise
    return monitor.run()
