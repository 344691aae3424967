"""A worker: serves requests through a connection loop until told to stop.

The worker is the loop's WorkerControl: it keeps its liveness slot current, counts requests,
asks the monitor for retirement (--max-requests) or promotion (--refork-after), and at a safe
point (no request in flight, no other thread) forks the next mold. Monitor commands are acted on
only when the loop hands control back, never in the middle of a request.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import random
import signal
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from refork import deadlines, fork_safety, hooks, integrations, lifecycle
from refork.config import hard_timeout
from refork.errors import StartupError
from refork.logs import count_lost_lines
from refork.memory.heap import after_fork_in_child
from refork.process import descriptors, messages, statsd
from refork.process.context import ProcessContext, set_title
from refork.process.forking import Promoted, fork_detached, signal_when_parent_dies
from refork.process.slots import AppClock
from refork.process.stacks import request_stack  # at import: never import in a signal handler

log = logging.getLogger("refork")
PROMOTION_RETRY = 10.0  # seconds before asking to be promoted again
SAFE_POINT_WAIT = 1.0  # seconds a request older than a Promote may keep the worker from its safe point
SAFE_POINT_BOUND = 3.0  # seconds any requests may (new ones are held meanwhile): then it declines
OVERDUE_SIGNAL = signal.SIGUSR2  # the monitor's "look at your overdue requests" (a blocked loop)
MONITOR_GONE_SIGNAL = signal.SIGHUP  # the kernel's, when the monitor (the parent) dies


def run_worker(
    ctx: ProcessContext, app: Any, interface: str, nr: int, generation: int, slot: int, age: int = 0
) -> int:
    after_fork_in_child()
    random.seed()
    set_title(f"{ctx.config.proc_name}: worker {nr} (gen {generation})")
    if ctx.config.fork_safety != "off":
        own = {ctx.report.fileno(), *(sock.fileno() for sock in ctx.listeners), *lifecycle.kept_fds()}
        descriptors.make_harmless(own, f"worker {nr} (gen {generation})")
    integrations.after_fork()
    cmd = ctx.register(messages.Spawned("worker", os.getpid(), generation, nr, slot))
    worker = Worker(ctx, cmd, app, interface, nr, generation, slot)
    config = ctx.config
    worker.hook_worker = hooks.Worker(
        config, pid=os.getpid(), ppid=ctx.monitor_pid, age=age, nr=nr, generation=generation, app=app,
        alive=lambda: not (worker.stopping or worker.exit_now),
    )
    worker.server = hooks.Server(config, ctx.monitor_pid)
    hooks.become(worker.hook_worker)
    try:
        worker.starting("running the after_fork hooks")
        lifecycle.run_hooks("after_fork")
        if "post_fork" in config.hooks:
            worker.starting("running the post_fork hook")
            hooks.call(config, "post_fork", worker.server, worker.hook_worker)
        if ctx.config.memray:
            from refork.memory.profiling import start_memray

            worker.memray = start_memray(ctx.config.memray, os.getpid())
            # The tracker runs a thread: forking a mold from this process would not be safe.
            fork_safety.mark_fork_unsafe("--memray tracker running")
        if "post_worker_init" in config.hooks:
            worker.starting("running the post_worker_init hook")
            hooks.call(config, "post_worker_init", worker.hook_worker)
    except Exception as e:
        return worker.failed_to_start(e)
    return worker.run()


class Worker:
    """One worker process's state; implements refork.serving.WorkerControl."""

    def __init__(
        self,
        ctx: ProcessContext,
        cmd: socket.socket,
        app: Any,
        interface: str,
        nr: int,
        generation: int,
        slot: int,
    ) -> None:
        self.ctx = ctx
        self.config = config = ctx.config
        self.cmd = cmd
        self.app = app
        self.interface = interface
        self.nr = nr
        self.generation = generation
        self.slot = slot
        self.slots = ctx.slots
        self.timeout = hard_timeout(config)  # --timeout 0: a deadline that never comes
        self.memray: object = None
        self.hook_worker = hooks.Worker(config, pid=os.getpid(), ppid=ctx.monitor_pid, nr=nr,
                                        generation=generation)  # fmt: skip
        self.server = hooks.Server(config, ctx.monitor_pid)  # what the hooks receive (run_worker's)
        record = bool(config.statsd_host)  # StatsD: status codes, durations and log lines in the slot
        clock = AppClock(ctx.slots, slot, self.timeout, time.monotonic, heartbeat=interface == "asgi",
                         record=record)  # fmt: skip
        self.clock = clock
        if record:
            slots = ctx.slots
            statsd.count_logs(lambda level: slots.count_log(slot, level))
        count_lost_lines(lambda log: ctx.slots.count_lost_line(slot, log))  # refork_log_write_errors_total
        # WorkerControl's per-request calls go straight to the clock: no wrapper on the hot path
        self.request_started: Callable[[str, bytes], object] = clock.started
        self.request_waiting: Callable[[object], None] = clock.waiting
        self.request_resumed: Callable[[object], None] = clock.resumed
        self.request_upgraded: Callable[[object], None] = clock.upgraded
        self.request_timeout = config.request_timeout
        self._timed_out = False  # a request passed --request-timeout: retirement asked
        self._hung_shown = 0  # the OVERDUE count last written to the slot
        self._stopping = False
        self.websocket_grace = 0.0  # a retirement's Stop: how long open WebSockets are served on
        self._exit_now = False
        self._orphaned = False  # the monitor is gone (_monitor_gone)
        self._ready = False  # the loop serves (ready_for_requests)
        self._phase = "starting"  # what it does before it is ready (see starting())
        self._promote_to: int | None = None
        self._promote_asked = 0.0  # when the monitor's Promote came
        self._retire_at = 0
        if config.max_requests > 0:
            self._retire_at = config.max_requests + random.randint(0, max(0, config.max_requests_jitter))
        self._refork_at = 0
        if config.refork_after and ctx.subreaper:
            thresholds = config.refork_after
            self._refork_at = thresholds[min(generation, len(thresholds) - 1)]
        self._promotion_asked = 0.0
        self._unsafe_reported = False
        self._next_check = self._next_threshold(0)  # request_finished() looks closer from there
        self._trimmer = None
        if config.malloc_trim:
            from refork.memory.allocator import MallocTrimmer

            self._trimmer = MallocTrimmer(min_interval=10.0)

    @property
    def requests(self) -> int:
        """Requests served by this worker."""
        return self.clock.served

    def ready_for_requests(self) -> None:
        """Counted as started (readiness, rollouts) only once the loop can serve."""
        self._ready = True
        self.ctx.tell(messages.Ready(os.getpid()))

    def starting(self, phase: str) -> None:
        """Tell the monitor what this worker does before it is ready (named if it dies there)."""
        self._phase = phase
        self.ctx.tell(messages.Starting(os.getpid(), phase))

    def failed_to_start(self, error: Exception) -> int:
        """An exception before the worker was ready: logged, reported with its phase; exit 3."""
        if isinstance(error, StartupError):  # its message says it all
            reason = str(error)
            log.error("worker %d failed while %s: %s", self.nr, self._phase, reason)
        else:
            reason = messages.last_line(error)
            log.exception("worker %d failed while %s", self.nr, self._phase)
        self.ctx.tell(messages.StartFailed(os.getpid(), self._phase, reason))
        return 3

    def run(self) -> int:
        from refork.serving import serve

        self.cmd.setblocking(False)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGQUIT, self._on_quit)
        signal.signal(signal.SIGINT, self._on_quit)
        signal.signal(OVERDUE_SIGNAL, self._on_overdue_signal)  # even when off: a HUP may turn it on
        if not faulthandler.is_enabled():  # (PYTHONFAULTHANDLER: its SIGABRT dumps every stack)
            signal.signal(signal.SIGABRT, self._on_abort)
        self._watch_the_monitor()
        deadlines.install(self.clock.extend)
        threads = self.config.threads if self.interface == "wsgi" else 0  # app threads, for the metrics
        self.slots.claim(self.slot, os.getpid(), time.monotonic() + self.timeout, threads, time.time())
        if not fork_safety.is_fork_safe():  # marked while starting (a hook, --memray): say so now
            self._report_unsafe()
        if self.interface == "asgi":
            self.starting("running the ASGI lifespan startup")
        try:
            serve(self.ctx.listeners, self.app, self.interface, self.config, self)
        except Exception as e:
            if self._ready:
                raise
            return self.failed_to_start(e)
        hooks.call_warned(self.config, "worker_exit", self.server, self.hook_worker)
        if self.memray is not None:
            from refork.memory.profiling import stop_memray

            stop_memray(self.memray)
        return 1 if self.hook_worker.aborted else 0  # (aborted past --timeout: gunicorn's exit 1)

    # Signals sent straight to a worker (gunicorn's conventions): TERM graceful, INT/QUIT now.
    def _on_term(self, signum: int, frame: object) -> None:
        self._stopping = True

    def _on_quit(self, signum: int, frame: object) -> None:
        self._stop_now()

    def _stop_now(self) -> None:
        """A fast stop (INT/QUIT, or the monitor's): gunicorn's worker_int hook runs once."""
        if not self._exit_now:
            self._exit_now = True
            hooks.call_logged(self.config, "worker_int", self.hook_worker)

    def _on_abort(self, signum: int, frame: object) -> None:
        """SIGABRT: the monitor found this worker past --timeout (SIGKILL follows a second later).
        gunicorn's worker_abort hook (a stack dump, usually) runs; then, as in gunicorn's sync
        worker, the request blocked in the app on this thread gets TimedOut raised into it (its
        client gets a 500 if its response has not started) and the loop exits after it; else (the
        loop of app threads) the loop answers its requests in the app and the worker exits now."""
        if self.hook_worker.aborted:
            return  # the app caught TimedOut and is still here: SIGKILL is on its way
        self.hook_worker.aborted = True
        self._exit_now = True
        hooks.call_logged(self.config, "worker_abort", self.hook_worker)
        if self._in_app_here():
            raise deadlines.TimedOut(f"the request passed --timeout {self.config.timeout:g}s in the app")
        try:
            deadlines.answer_timed_out()
        except Exception:
            log.exception("worker %d: answering the requests in the app past --timeout failed", self.nr)
        logging.shutdown()
        os._exit(1)

    def _in_app_here(self) -> bool:
        """A request is in the app on this thread (the signal handler's: the loop's)."""
        token = deadlines.current.get()
        if token is deadlines.ENGINE:
            find = self.clock.engine_request
            token = find(False) if find is not None else None
        return token is not None

    def _watch_the_monitor(self) -> None:
        """With a subreaper the monitor is this worker's parent (once the middle process of the
        double fork is gone): the kernel signals its death, even to a thread stuck in the app."""
        signal.signal(MONITOR_GONE_SIGNAL, self._on_monitor_gone)
        if not self.ctx.subreaper:
            return  # the mold is the parent: its death is not the monitor's (EOF still says it)
        monitor, until = self.ctx.monitor_pid, time.monotonic() + 1.0
        while (parent := os.getppid()) != monitor and parent != 1 and time.monotonic() < until:
            time.sleep(0.001)  # still the double fork's middle process: it exits at once
        if parent == monitor and signal_when_parent_dies(MONITOR_GONE_SIGNAL) and os.getppid() == monitor:
            return
        if os.getppid() != monitor:
            self._monitor_gone()  # it died before we could ask

    def _on_monitor_gone(self, signum: int, frame: object) -> None:
        if os.getppid() != self.ctx.monitor_pid:  # not a HUP sent by someone else
            self._monitor_gone()

    def _monitor_gone(self) -> None:
        """The monitor died (its socket's EOF, or the kernel's signal: this may run in a signal
        handler, on a thread stuck in the app). Nobody will replace this worker or stop it: stop
        accepting and let go of the listening sockets now (a restarted server can bind), finish
        what is in flight, and exit after --graceful-timeout whatever is still running. Said once;
        the dead command socket is swapped for a descriptor that is never readable, so no loop
        spins on its end of file."""
        if self._orphaned:
            return
        self._orphaned = True
        self._stopping = True
        grace = max(1, math.ceil(self.config.graceful_timeout))
        log.warning("worker %d: the monitor is gone; finishing in-flight requests, exiting within %ds",
                    self.nr, grace)  # fmt: skip
        quiet = os.eventfd(0, os.EFD_CLOEXEC)
        for fd in (self.cmd.fileno(), *(sock.fileno() for sock in self.ctx.listeners)):
            if fd >= 0:
                os.dup2(quiet, fd)  # the number stays taken: the loops holding it see nothing
        os.close(quiet)
        signal.alarm(grace)  # SIGALRM's default action ends the process

    # WorkerControl
    def fileno(self) -> int:
        return self.cmd.fileno()

    def on_readable(self) -> None:
        while True:
            try:
                received = messages.receive(self.cmd)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                received = None
            if received is None:
                self._monitor_gone()
                return
            message, _ = received
            if isinstance(message, messages.Stop):
                if message.graceful:
                    self._stopping = True
                    self.websocket_grace = message.websockets
                else:
                    self._stop_now()
            elif isinstance(message, messages.Promote):
                self._promote_to = message.generation
                self._promote_asked = time.monotonic()
            elif isinstance(message, messages.ReopenLogs):
                from refork.logs import reopen_log_files

                reopen_log_files()

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def exit_now(self) -> bool:
        return self._exit_now

    @property
    def safe_point_wanted(self) -> bool:
        return self._promote_to is not None and not self._stopping

    def at_safe_point(self) -> None:
        generation, self._promote_to = self._promote_to, None
        if generation is None:
            return
        if not fork_safety.is_fork_safe():
            self._report_unsafe()
            return
        integrations.before_promotion()
        try:
            lifecycle.run_hooks("before_promotion")
            hooks.call(self.config, "pre_promotion", self.server, self.hook_worker)
        except Exception:
            log.exception("a before_promotion/pre_promotion hook raised; this worker will not be promoted")
            fork_safety.mark_fork_unsafe("the pre_promotion hook raised")
            self._report_unsafe()
            return
        why = (
            f"reached {self._refork_at} requests"
            if self._refork_at and self.requests >= self._refork_at
            else "asked by the monitor"
        )
        log.info(
            "worker %d (gen %d): promoted to mold of gen %d (%s; %d served)",
            self.nr,
            self.generation,
            generation,
            why,
            self.requests,
        )
        descriptors.remember_before_fork()
        if fork_detached():
            self.cmd.close()
            raise Promoted(generation)  # the mold that forked this worker runs it as a mold

    def request_finished(self, token: object, status: int) -> None:
        served = self.clock.finished(token, status)
        if served >= self._next_check:  # (the tick reports a fork-safety mark in between)
            self._next_check = self.requests_served(served)

    def requests_served(self, requests: int) -> int:
        """What follows a request served (the --max-requests and --refork-after checks, a fork-safety
        mark to report); the native engine, which counts its requests itself, calls it when the
        count reaches the number this returns (0: never)."""
        if requests == self._retire_at:
            self.ctx.tell(
                messages.WantsRetirement(os.getpid(), f"served {requests} requests (--max-requests)")
            )
        if self._refork_at and requests >= self._refork_at:
            self._maybe_ask_promotion(requests)
        if not self._unsafe_reported and not fork_safety.is_fork_safe():
            self._report_unsafe()
        if self._refork_at and requests >= self._refork_at:
            return requests + 1
        return self._next_threshold(requests)

    def _next_threshold(self, requests: int) -> int:
        """The next count past `requests` at which requests_served() has something to do."""
        return min(n for n in (self._retire_at, self._refork_at, 1 << 62) if n > requests)

    def health(self, kind: str) -> int:
        return self.ctx.readiness.health(kind)

    def http2_count(self, what: str, n: int = 1) -> None:
        self.slots.count_http2(self.slot, what, n)

    def static_count(self, status: int) -> None:
        self.clock.count_static(status)  # (app threads and the pool's I/O thread count at once)
        self.clock.static(deadlines.current.get())  # not among the app's requests

    @property
    def free_threads_elsewhere(self) -> bool:
        return self.ctx.readiness.free_threads > 0  # ours are all busy when this is asked

    def free_threads_address(self) -> int:
        return self.ctx.readiness.free_threads_address()

    @property
    def server_draining(self) -> bool:
        return self.ctx.readiness.draining

    def tick(self) -> None:
        self.clock.tick()
        if self._promote_to is not None:
            asked = self._promote_asked
            waited = time.monotonic() - asked
            if waited > SAFE_POINT_BOUND:
                self._decline_promotion(f"no safe point within {SAFE_POINT_BOUND:g}s; serving on")
            elif waited > SAFE_POINT_WAIT and self.clock.in_flight_since(asked):
                self._decline_promotion(
                    f"a request older than the ask still in flight after {SAFE_POINT_WAIT:g}s; serving on"
                )
        if not self._unsafe_reported and not fork_safety.is_fork_safe():  # (the engine's requests)
            self._report_unsafe()
        if self.request_timeout is not None:
            self._check_overdue(None)
        if not self.clock.busy and self._trimmer is not None:
            self._trimmer.maybe_trim(time.monotonic())

    # --request-timeout
    def _on_overdue_signal(self, signum: int, frame: FrameType | None) -> None:
        """The monitor saw the soft deadline pass on the slots page while this worker did not report
        it: its loop thread is blocked in the app. We run on that thread, between two bytecodes of
        the stuck code: `frame` is where it is stuck."""
        if self.request_timeout is not None:
            self._check_overdue(frame, in_handler=True)

    def _check_overdue(self, interrupted: FrameType | None, in_handler: bool = False) -> None:
        """Log each request newly past --request-timeout with its stack (once), ask to be replaced,
        and show the hung ones in the slot."""
        assert self.request_timeout is not None
        found = self.clock.overdue(self.request_timeout, blocking=not in_handler)
        if found:
            now = time.monotonic()
            for token in found:
                extended = self.clock.extension(token)
                log.error(
                    "request timeout: %s %s in the app for %.1fs (--request-timeout %gs%s); "
                    "worker %d (pid %d, gen %d) will be replaced; the stack running it:\n%s",
                    token.method or "-",
                    token.path.decode("latin-1") or "-",
                    now - token.began,
                    self.request_timeout,
                    f" + {extended:g}s extended" if extended else "",
                    self.nr,
                    os.getpid(),
                    self.generation,
                    request_stack(token, interrupted).rstrip("\n"),
                )
            if not self._timed_out:
                self._timed_out = True
                first = found[0]
                reason = (
                    f"request timeout: {first.method} {first.path.decode('latin-1')} "
                    f"in the app over {self.request_timeout:g}s"
                )
                self.ctx.tell(messages.WantsRetirement(os.getpid(), reason, cause="request_timeout"))
        hung = self.clock.hung
        if hung != self._hung_shown:
            self._hung_shown = hung
            self.slots.set_overdue(self.slot, hung)

    def _maybe_ask_promotion(self, requests: int) -> None:
        now = time.monotonic()
        if now - self._promotion_asked < PROMOTION_RETRY or not fork_safety.is_fork_safe():
            return
        self._promotion_asked = now
        self.ctx.tell(messages.WantsPromotion(os.getpid(), requests))

    def _decline_promotion(self, reason: str) -> None:
        """No safe point in time: a request that was in flight when the Promote came is still there
        (a long or hung one), or requests kept coming (a loop that cannot hold them: HTTP/2 streams).
        Rather than hold new requests any longer, serve on and let the monitor forget this mold (it
        asks another worker); this worker asks again later."""
        generation, self._promote_to = self._promote_to, None
        assert generation is not None
        log.info("worker %d (gen %d): not promoted to mold of gen %d: %s", self.nr, self.generation,
                 generation, reason)  # fmt: skip
        self._promotion_asked = time.monotonic()
        self.ctx.tell(messages.PromotionDeclined(os.getpid(), generation, reason))

    def _report_unsafe(self) -> None:
        self._unsafe_reported = True
        self.ctx.tell(messages.ForkUnsafe(os.getpid(), fork_safety.unsafe_reason() or "fork-unsafe"))
