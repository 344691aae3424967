"""The monitor: the process the user starts. It supervises and never imports the app.

This file is the loop and the hands; the decisions are refork.process.supervisor.core's. One loop:
wait for a signal, a child's report, a control-socket client or the next tick; turn each into an
event for the supervisor and carry out the actions it returns (fork a mold, send a command,
signal, log, run a hook, exit). Every mold and worker is its direct child (child subreaper), so
it alone reaps and signals them all.
"""

from __future__ import annotations

import logging
import os
import platform
import select
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from refork.config import Config, ConfigError, idle_mold_linger
from refork.hooks import Server, worker_for_exit
from refork.loading import change_directory
from refork.memory.accounting import read_memory
from refork.memory.allocator import fix_glibc_thresholds, loaded_allocator, malloc_trim
from refork.process import messages, systemd
from refork.process.context import ProcessContext, set_title
from refork.process.control import ControlServer
from refork.process.forking import (
    MONITOR_SIGNALS,
    kill_strays,
    make_subreaper,
    reset_signals_in_child,
    run_child,
)
from refork.process.identity import check_switch, chown_files, daemonize, drop_privileges
from refork.process.listen_queue import listen_queue
from refork.process.listeners import (
    Port,
    activated,
    bind,
    describe,
    handshakes_in_flight,
    owned,
    seal,
    tcp_ports,
)
from refork.process.metrics import ListenerSample, Snapshot, Totals, WorkerSample, render
from refork.process.metrics_server import MetricsServer
from refork.process.monitor_heap import prepare_monitor_heap
from refork.process.monitor_hooks import MonitorHooks
from refork.process.pidfile import remove_pidfile, write_pidfile
from refork.process.slots import Slots
from refork.process.statsd import Statsd, WorkerView, count_logs
from refork.process.supervisor import events as ev
from refork.process.supervisor.core import Supervisor
from refork.process.watch import Watcher
from refork.serving import check_tls

log = logging.getLogger("refork")
TICK = 0.25  # the longest the loop sleeps, seconds
HANDSHAKES_WAIT = 0.03  # at a graceful stop, the longest the loop waits at once for handshakes to land
STATUS_FRESHNESS = 1.0  # `refork status` re-reads memory samples older than this
FORK_WAIT = 1.0  # the longest a mold's fork waits for a running hook to finish, seconds

SIGNAL_EVENTS: dict[int, ev.Event] = {
    signal.SIGTERM: ev.StopRequested("graceful"),
    signal.SIGINT: ev.StopRequested("fast"),
    signal.SIGQUIT: ev.StopRequested("fast"),
    signal.SIGHUP: ev.ReloadRequested(),
    signal.SIGUSR1: ev.ReopenLogsRequested(),
}


class Monitor:
    def __init__(self, config: Config, reread: Callable[[], Config] | None = None) -> None:
        self.config = config
        self.reread = reread  # builds the config again from the same flags, file and environment
        self.signals: deque[int] = deque()
        self.channels: dict[int, socket.socket] = {}  # pid -> our end of the child's command socket
        self.watcher: Watcher | None = None  # --reload
        self.exit_code: int | None = None  # set by the supervisor's Exit
        self.last_words = ""  # the supervisor's PrintError: stderr's last line at exit
        self.notifier: systemd.Notifier | None = None  # Type=notify: $NOTIFY_SOCKET
        self.unix_paths: list[str] = []  # unix listeners to unlink at exit
        self.owned_listeners: list[socket.socket] = []  # bound by us: sealed at a graceful stop
        self.sealed_ports: list[Port] = []  # their TCP ports, once sealed
        self.metrics: MetricsServer | None = None  # --metrics-bind
        self.statsd: Statsd | None = None  # --statsd-host
        self.totals = Totals(len(config.metrics_buckets))  # the counts of exited workers (metrics)

    # -- set-up ----------------------------------------------------------------------------------
    def start(self) -> None:
        config = self.config
        set_title(f"{config.proc_name}: monitor")
        # First: a control socket location that is unsafe refuses the start before anything is
        # bound, written or run.
        self.control = ControlServer.open(config, self)
        if config.pidfile:
            write_pidfile(config.pidfile)
        self.hooks = MonitorHooks(Server(config, os.getpid()))
        self.hooks.run_now("on_starting", config, config.workers)
        subreaper = make_subreaper()
        if not subreaper:
            log.warning("child subreaper unavailable: workers are children of the mold; reforking is off")
            if isinstance(config.mold_idle_exit, float):
                log.warning("--mold-idle-exit needs a child subreaper; the mold will stay")
        passed = systemd.take_listen_fds(os.environ, os.getpid())
        if passed:
            listeners = activated(passed, config.backlog)
            log.info("socket activation: %d socket(s) from systemd; --bind is not used", len(passed))
        else:
            listeners = bind(config.bind, config.backlog, config.reuse_port)
        self.owned_listeners = [] if passed else owned(config.bind, listeners)
        self.notifier = systemd.Notifier.from_environ(os.environ, os.getpid())
        self.unix_paths = [s.getsockname() for s in listeners if s.family == socket.AF_UNIX and not passed]
        self.report_in, report_out = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.report_in.setblocking(False)
        capacity = max(256, 4 * config.workers)
        python = platform.python_version()
        self.supervisor = Supervisor(config, subreaper=subreaper, capacity=capacity, python=python)
        slots = Slots(capacity, config.metrics_buckets)
        self.ctx = ProcessContext(config, listeners, report_out, slots, subreaper)
        if config.metrics_bind:
            self.metrics = MetricsServer.open(config.metrics_bind, self.metrics_text)
        self._start_statsd(config)
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        for sig in MONITOR_SIGNALS:
            signal.signal(sig, self._on_signal)
        for sock in listeners:
            log.info("listening on %s", describe(sock))
        if self.control.path:
            log.info("control socket: %s", self.control.path)
        if self.metrics is not None:
            log.info("metrics: GET /metrics on %s", self.metrics.address)
        if self.statsd is not None:
            log.info("statsd: metrics to %s", self.statsd.address)
        log.info(
            "monitor %d: %d worker(s), %s",
            os.getpid(),
            config.workers,
            "subreaper" if subreaper else "no subreaper",
        )
        if config.reload:
            dirs = config.reload_dirs or [os.path.abspath(d) for d in (os.getcwd(), *config.pythonpath)]
            self.watcher = Watcher(dirs, extra=config.reload_extra_files)
            log.info("--reload: watching %d *.py files under %s", len(self.watcher.files), ", ".join(dirs))
        safe, detail = prepare_monitor_heap(config.immortalize)  # last: all it made is shared
        log.debug("monitor heap: %s", detail)
        if not safe:
            self.feed(ev.ImmortalizationUnsafe(detail))
        self.feed(ev.Boot())

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> int:
        while self.exit_code is None:
            now = time.monotonic()
            control = self.control
            readers = [self.wake_r, self.report_in, *control.readers(now)]
            metrics = self.metrics
            writers = [*control.writers(), *(metrics.writers() if metrics is not None else [])]
            if metrics is not None:
                readers += metrics.readers()
            try:
                ready, writable, _ = select.select(readers, writers, [], TICK)
            except InterruptedError:
                ready, writable = [], []
            if self.wake_r in ready:
                self._drain_wakeups()
            self._handle_signals()
            self._read_reports()
            self._reap()
            now = time.monotonic()
            for sock in ready:
                if sock in control.clients or sock is control.listener:
                    control.on_readable(sock, now)
            for sock in writable:
                if sock in control.clients:
                    control.on_writable(sock)
            control.sweep(now)
            if metrics is not None:
                metrics.on_ready(ready, writable, time.monotonic())
            self._poll_watcher()
            self.hooks.check(time.monotonic())
            self.feed(ev.Tick(self._read_slots()))
            self._count_free_threads()
            if self.statsd is not None:
                self.statsd.tick(time.monotonic(), self._statsd_workers())
            if self.notifier is not None:
                self.notifier.tick(time.monotonic(), self._status_text())
        self.shutdown()
        return self.exit_code

    def _drain_wakeups(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _handle_signals(self) -> None:
        while self.signals:
            sig = self.signals.popleft()
            if sig == signal.SIGUSR2:
                self.refork_now()
            elif sig in (signal.SIGTTIN, signal.SIGTTOU):
                self.set_worker_count(self.target_workers + (1 if sig == signal.SIGTTIN else -1))
            elif sig in SIGNAL_EVENTS:
                self.feed(SIGNAL_EVENTS[sig])

    def _read_reports(self) -> None:
        while True:
            try:
                received = messages.receive(self.report_in)
            except (BlockingIOError, InterruptedError):
                return
            if received is None:
                return
            message, attached = received
            if isinstance(message, messages.Spawned) and attached is not None:
                self.channels[message.pid] = attached  # closed again if the supervisor refuses it
            if isinstance(message, messages.WorkerExited):
                self.feed(ev.ChildExited(message.pid, message.status))
            elif isinstance(message, ev.Report):
                self.feed(message)

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
            self.feed(ev.ChildExited(pid, status))

    def _poll_watcher(self) -> None:
        """--reload: edits made during a reload wait for it (the watcher is not polled meanwhile)."""
        if self.watcher is None or not self.supervisor.reload_possible:
            return
        edits = self.watcher.poll(time.monotonic())
        if edits:
            self.feed(ev.FilesChanged(tuple(edits)))

    def _read_slots(self) -> dict[int, ev.SlotReading]:
        """The shared page, for the slots of known workers."""
        slots = self.ctx.slots
        return {
            c.slot: ev.SlotReading(slots.owner(c.slot), slots.deadline(c.slot), slots.requests(c.slot),
                                   slots.websockets(c.slot), slots.busy(c.slot), slots.overdue(c.slot),
                                   slots.threads(c.slot))  # fmt: skip
            for c in self.supervisor.roster.workers()
            if c.slot >= 0
        }

    def _count_free_threads(self) -> None:
        """App threads free in the serving workers, for the shared page: a worker with none free
        of its own stops accepting while another has one (refork.serving.wsgi.python_loop)."""
        slots = self.ctx.slots
        free = sum(
            slots.free_threads(c.slot)
            for c in self.supervisor.roster.workers()
            if c.ready and not c.stopping and c.slot >= 0 and slots.owner(c.slot) == c.pid
        )
        self.ctx.readiness.set_free_threads(free, time.monotonic())

    # -- events in, actions out ------------------------------------------------------------------
    def feed(self, event: ev.Event) -> list[ev.Action]:
        """Hand one event to the supervisor and carry out its actions; return them (and those of
        the events they led to) so a caller can look for an answer such as Refused."""
        done: list[ev.Action] = []
        for action in self.supervisor.handle(event, time.monotonic()):
            done.append(action)
            answer = self._carry_out(action)
            if answer is not None:
                done += self.feed(answer)
        return done

    def _carry_out(self, action: ev.Action) -> ev.Event | None:
        """Do one action; return the event that reports its outcome, if the supervisor needs one."""
        if isinstance(action, ev.Log):
            log.log(action.level, "%s", action.text)
        elif isinstance(action, ev.Send):
            if not self._send(action.pid, action.message):
                return ev.SendFailed(action.pid, action.message)
        elif isinstance(action, ev.Signal):
            try:
                os.kill(action.pid, action.signum)
            except ProcessLookupError:
                pass
        elif isinstance(action, ev.ReleaseSlot):
            self.totals.fold(self.ctx.slots.counters(action.slot))  # server-wide counters never go down
            if self.statsd is not None:
                self.statsd.worker_gone(action.slot)
            self.ctx.slots.release(action.slot)
        elif isinstance(action, ev.CloseChannel):
            conn = self.channels.pop(action.pid, None)
            if conn is not None:
                conn.close()
        elif isinstance(action, ev.ForkMold):
            return ev.MoldForked(self._fork_mold(action.generation, action.config))
        elif isinstance(action, ev.RunHook):
            self._run_hook(action.name, action.config, *action.extra)
        elif isinstance(action, ev.SampleMemory):
            return ev.MemorySampled({pid: read_memory(pid) for pid in action.pids})
        elif isinstance(action, ev.RereadConfig):
            return self._reread_config()
        elif isinstance(action, ev.AdoptConfig):
            self._adopt_config(action.config)
        elif isinstance(action, ev.ReopenLogFiles):
            from refork.logs import reopen_log_files

            reopen_log_files()
        elif isinstance(action, ev.PrintError):
            self.last_words = action.text
        elif isinstance(action, ev.Announce):
            self._announce(action.milestone)
        elif isinstance(action, ev.CloseListeners):
            self.sealed_ports = tcp_ports([sock for sock in self.owned_listeners if seal(sock)])
            for sock in self.ctx.listeners:
                sock.close()  # workers take the backlog; the last to close is one of them
            return ev.HandshakesCounted(self._settled_handshakes())
        elif isinstance(action, ev.CountHandshakes):
            return ev.HandshakesCounted(handshakes_in_flight(self.sealed_ports))
        elif isinstance(action, ev.Exit):
            self.exit_code = action.code
        return None  # Refused is an answer for the caller of feed()

    def _settled_handshakes(self) -> int:
        """Handshakes under way on the sealed listeners after a short wait: one on loopback or a
        LAN lands within milliseconds; a later one is counted again each tick."""
        until = time.monotonic() + HANDSHAKES_WAIT
        while (pending := handshakes_in_flight(self.sealed_ports)) and time.monotonic() < until:
            time.sleep(0.002)
        return pending

    def _announce(self, milestone: str) -> None:
        """A milestone: the shared readiness page for health checks, and systemd if it listens."""
        readiness = self.ctx.readiness
        if milestone == "ready":
            readiness.set_ready()
            malloc_trim()  # the start-up's freed pages, ours alone once the mold wrote its copies: ~1 MiB
        elif milestone == "stopping":
            readiness.set_draining()
        text = {"ready": "ready", "reloaded": "ready again after the reload", "stopping": "draining"}
        if milestone in text:
            log.info("server %s (readiness %s)", text[milestone], "off" if milestone == "stopping" else "on")
        if self.notifier is not None:
            self.notifier.announce(milestone, self._status_text())

    def _status_text(self) -> str:
        sup = self.supervisor
        up = sum(1 for c in sup.roster.workers() if c.ready and not c.stopping)
        state = "stopping" if sup.stopping else "draining" if sup.delay_until is not None else ""
        return systemd.status_text(sup.generation, up, sup.target_workers, state)

    def _send(self, pid: int, message: messages.Command) -> bool:
        conn = self.channels.get(pid)
        if conn is None:
            return False
        try:
            messages.send(conn, message)
            return True
        except OSError:
            return False

    def _fork_mold(self, generation: int, config: Config | None) -> int:
        """Fork a fresh mold (it imports the app), with a reloaded config if given."""
        private = [self.report_in, self.wake_r, self.wake_w, *self.control.sockets(), *self.channels.values()]
        if self.notifier is not None:
            private.append(self.notifier.sock)
        if self.metrics is not None:
            private += self.metrics.sockets()
        ctx = replace(self.ctx, config=config) if config is not None else self.ctx
        self.hooks.settle(FORK_WAIT)
        pid = os.fork()
        if pid == 0:
            for sock in private:
                sock.close()
            reset_signals_in_child()
            from refork.process.mold import boot_mold  # never in the monitor; still as its user

            drop_privileges(ctx.config)  # --user/--group: before the app is imported
            if config is not None:
                from refork.logs import setup_logging

                setup_logging(ctx.config)
            run_child(partial(boot_mold, ctx, generation))
        return pid

    def _reread_config(self) -> ev.ConfigReread:
        """The config as the flags, config file and environment say now, or why it cannot be built."""
        if self.reread is None:
            return ev.ConfigReread()
        try:
            config = self.reread()
            check_tls(config)  # new certificate files that do not load: keep the running generation
            return ev.ConfigReread(config)
        except ConfigError as e:
            return ev.ConfigReread(error=str(e))
        except Exception as e:  # the config file is user code: one line, and keep serving
            return ev.ConfigReread(error=f"the config file raised {type(e).__name__}: {e}")

    def _adopt_config(self, config: Config) -> None:
        """A reloaded mold is ready: its config is the monitor's, and every later child's."""
        previous, self.config = self.config, config
        self.ctx.config = config
        if (config.error_logfile, config.log_level) != (previous.error_logfile, previous.log_level):
            from refork.logs import setup_logging

            setup_logging(config)
            if self.statsd is not None:
                count_logs(self.statsd.count_monitor_log)  # (setup_logging replaced the handlers)
        statsd = (config.statsd_host, config.statsd_prefix, config.dogstatsd_tags)
        if statsd != (previous.statsd_host, previous.statsd_prefix, previous.dogstatsd_tags):
            if self.statsd is not None:
                self.statsd.close()
                self.statsd = None
            self._start_statsd(config)

    def _start_statsd(self, config: Config) -> None:
        if config.statsd_host:
            self.statsd = Statsd(config.statsd_host, config.statsd_prefix, config.dogstatsd_tags,
                                 self.ctx.slots)  # fmt: skip

    def _statsd_workers(self) -> list[WorkerView]:
        """The workers StatsD reads: those that claimed their slot."""
        slots = self.ctx.slots
        out = []
        for c in self.supervisor.roster.workers():
            if c.slot >= 0 and slots.owner(c.slot) == c.pid:
                m = c.memory
                uss, pss = (m.uss, m.pss) if m is not None else (None, None)
                out.append(WorkerView(c.slot, c.pid, c.nr, uss, pss, c.memory_at))
        return out

    def _run_hook(self, name: str, config: Config, *extra: Any) -> None:
        """A config-file hook in the monitor, with gunicorn's arguments, on the hook thread
        (refork.process.monitor_hooks): it never stops the loop; its exception is logged."""
        if name == "child_exit":
            info = extra[0]
            extra = (worker_for_exit(config, info["pid"], info["role"], info["nr"], info["generation"],
                                     info["age"], info["status"]),)  # fmt: skip
        self.hooks.run(name, config, extra, self.supervisor.target_workers)

    # -- control commands (refork.process.control.Commands) ---------------------------------------
    @property
    def target_workers(self) -> int:
        return self.supervisor.target_workers

    def set_worker_count(self, count: int) -> None:
        self.feed(ev.SetWorkerCount(count))

    def refork_now(self) -> bool:
        """USR2 / `refork refork`: True if a worker is being promoted."""
        actions = self.feed(ev.ReforkRequested(self._read_slots()))
        return not any(isinstance(a, ev.Refused) for a in actions)

    def reload(self) -> str | None:
        """HUP / `refork reload`: why no reload was started, or None."""
        refusals = [a.reason for a in self.feed(ev.ReloadRequested()) if isinstance(a, ev.Refused)]
        return refusals[0] if refusals else None

    def _fresh_memory(self) -> None:
        """Re-read the memory samples older than a second (so frequent scrapes cost one read a second)."""
        now = time.monotonic()
        stale = [
            c.pid
            for c in self.supervisor.roster.children()
            if c.memory is None or now - c.memory_at > STATUS_FRESHNESS
        ]
        if stale:
            self.feed(ev.MemorySampled({pid: read_memory(pid) for pid in stale}, check_limit=False))

    def status(self) -> dict[str, Any]:
        """`refork status`: every process with its memory (re-read if older than a second)."""
        sup = self.supervisor
        self._fresh_memory()
        children = sorted(sup.roster.children(), key=lambda c: (c.role != "mold", c.generation, c.nr))
        slots = self.ctx.slots
        rows = [
            c.status_row(slots.requests(c.slot), slots.overdue(c.slot)) if c.slot >= 0 else c.status_row(0)
            for c in children
        ]
        for c, row in zip(children, rows, strict=True):  # open WebSockets (ASGI), busy app threads
            counters = slots.counters(c.slot) if c.slot >= 0 and c.role == "worker" else None
            row["websockets"] = counters.websockets if counters is not None else 0
            row["http2"] = counters.http2["connections"] if counters is not None else 0
            row["busy"] = counters.busy if counters is not None else 0
            row["threads"] = counters.threads if counters is not None else 0
        return {
            "app": self.config.app,
            "bind": list(self.config.bind),
            "monitor_pid": os.getpid(),
            "generation": sup.generation,
            "workers": sup.target_workers,
            "allocator": loaded_allocator("self"),
            "subreaper": self.ctx.subreaper,
            "refork_pending": sup.roster.pending_mold() is not None,
            "mold_idle_exit": idle_mold_linger(self.config.mold_idle_exit, sup.target_workers),
            "mold_shed": sup.mold_shed and sup.roster.current_mold() is None,
            "total_pss": sum(r["pss"] or 0 for r in rows),
            "restarts": dict(sup.restarts),  # workers replaced, by cause (as the metrics count them)
            "processes": rows,
        }

    def metrics_snapshot(self) -> Snapshot:
        """What `GET /metrics` shows, read from the slots page and the supervisor (never the app)."""
        sup = self.supervisor
        self._fresh_memory()
        slots = self.ctx.slots
        workers, states = [], {"starting": 0, "ready": 0, "stopping": 0}
        for c in sorted(sup.roster.workers(), key=lambda c: (c.nr, c.generation)):
            state = "stopping" if c.stopping else ("ready" if c.ready else "starting")
            states[state] += 1
            counters = slots.counters(c.slot) if c.slot >= 0 and slots.owner(c.slot) == c.pid else None
            workers.append(WorkerSample(c.nr, c.generation, counters, c.memory))
        mold = sup.roster.current_mold()
        if mold is not None:
            mold_state = "ready" if mold.ready and not mold.stopping else "starting"
        else:
            mold_state = "stopped_idle" if sup.mold_shed else "none"
        queues = []
        for sock in self.ctx.listeners:
            if sock.fileno() < 0:
                continue  # closed for a graceful stop: the workers drain what is queued
            queue = listen_queue(sock)
            queues.append(ListenerSample(describe(sock), *(queue or (None, None))))
        return Snapshot(
            bounds=slots.bounds,
            now=time.time(),
            totals=self.totals,
            workers=workers,
            worker_states=states,
            target_workers=sup.target_workers,
            restarts=sup.restarts,
            generation=sup.generation,
            mold_state=mold_state,
            mold_pending=sup.roster.pending_mold() is not None,
            listeners=queues,
            commands=self.control.served,
        )

    def metrics_text(self) -> str:
        return render(self.metrics_snapshot())

    # -- stopping --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        self._run_hook("on_exit", self.config)
        self.hooks.finish(self.config)
        if self.statsd is not None:
            self.statsd.flush(self._statsd_workers())
            self.statsd.close()
        self.control.close()
        if self.metrics is not None:
            self.metrics.close()
        for sock in self.ctx.listeners:
            sock.close()
        for path in self.unix_paths:
            try:
                os.unlink(path)
            except OSError:
                pass
        if self.notifier is not None:
            self.notifier.close()
        if self.config.pidfile:
            remove_pidfile(self.config.pidfile)
        kill_strays()
        log.info("monitor %d: stopped", os.getpid())
        if self.last_words:
            print(self.last_words, file=sys.stderr, flush=True)


def run(config: Config, reread: Callable[[], Config] | None = None) -> int:
    """Run the server until it is stopped; return the exit status. `reread` serves HUP."""
    from refork.logs import check_log_files, log_notes, setup_logging

    if config.umask is not None:
        os.umask(config.umask)
    check_switch(config)
    check_log_files(config)  # a log file refork cannot write: one line, before anything starts
    chown_files(config, [p for p in (config.error_logfile, config.access_logfile) if p and p != "-"])
    if config.daemon:
        daemonize(config.enable_stdio_inheritance)
    setup_logging(config)
    log_notes(config)
    if config.allocator == "jemalloc":
        from refork.memory.allocator import reexec_with_jemalloc

        reexec_with_jemalloc(sys.argv)
    fix_glibc_thresholds()  # (glibc only) inherited by the molds and workers
    change_directory(config.chdir)
    check_tls(config)  # a bad certificate or key: one line and exit 2, before anything is bound
    monitor = Monitor(config, reread)
    try:
        monitor.start()
    except BaseException:
        control = getattr(monitor, "control", None)  # not there if it was the control socket that failed
        if control is not None:
            control.close()
        if config.pidfile:
            remove_pidfile(config.pidfile)  # only if it was ours
        raise
    return monitor.run()
