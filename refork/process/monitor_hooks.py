"""The monitor's config-file hooks, run on a thread beside its loop so that none can stop it.

gunicorn calls them in its master's loop: a `when_ready` or `child_exit` that hangs there stops
everything (nothing served, dead workers never replaced, TERM ignored). Here the loop hands each
call to a thread that runs them one at a time in the order asked (`child_exit` calls in exit
order, `when_ready` once), and supervises on. A hook still running past its deadline
(`--graceful-timeout`, at least a second) is named in one WARNING line and left running on its
own: the calls after it get a new thread. At exit the monitor waits for `on_exit` (and the calls
queued before it) at most that deadline. `on_starting` runs before the loop exists, in line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from refork.config import Config
from refork.hooks import GunicornConfig, Server, call_logged

log = logging.getLogger("refork")
MIN_DEADLINE = 1.0  # seconds: the least a hook gets before it is named (--graceful-timeout 0)
HUNG_MAX = 4  # hooks left running past their deadline at once; past this, calls are skipped
WAIT_STEP = 0.25  # while waiting at exit, how often a hook past its deadline is looked for


def deadline(config: Config) -> float:
    """How long a monitor hook runs before it is named and no longer waited for."""
    return max(config.graceful_timeout, MIN_DEADLINE)


@dataclass
class _Call:
    name: str
    config: Config
    extra: tuple[Any, ...]
    num_workers: int


class _Runner:
    """One thread's progress: the call it runs (None between calls) and since when."""

    def __init__(self) -> None:
        self.call: _Call | None = None
        self.since = 0.0


class MonitorHooks:
    """The queue of monitor hook calls and the thread that runs them (see the module docs)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._queue: deque[_Call] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._runner: _Runner | None = None  # the thread the queue waits for
        self._hung: list[_Runner] = []  # left behind past their deadline, still running

    def run_now(self, name: str, config: Config, num_workers: int) -> None:
        """Run a hook in this thread (on_starting: before the loop, where TERM still just ends it,
        and so does a sys.exit() in the hook)."""
        if name in config.hooks:
            self._prepare(num_workers, config)
            call_logged(config, name, self.server)

    def run(self, name: str, config: Config, extra: tuple[Any, ...], num_workers: int) -> None:
        """Queue a hook call for the hook thread; return at once."""
        if name not in config.hooks:
            return
        with self._lock:
            if self._runner is None and len(self._hung) >= HUNG_MAX:
                log.warning("hook %s not run: %d earlier hooks still hang", name, len(self._hung))
                return
            self._queue.append(_Call(name, config, extra, num_workers))
            if self._runner is None:
                self._start()

    def check(self, now: float) -> None:
        """From the loop: a hook past its deadline is named once, and the queue moves on without it."""
        with self._lock:
            self._leave_late(now, "supervising on without it")

    def settle(self, timeout: float) -> None:
        """Let a running hook finish first, up to `timeout` seconds (before a mold is forked: a
        fork in the middle of a hook copies its half-done state, an import's lock say)."""
        until = time.monotonic() + timeout
        with self._lock:
            while self._runner is not None and (left := until - time.monotonic()) > 0:
                self._changed.wait(left)

    def finish(self, config: Config) -> None:
        """At exit: wait for the queued calls (on_exit last) at most the deadline; name what still runs."""
        until = time.monotonic() + deadline(config)
        with self._lock:
            while self._runner is not None and (left := until - time.monotonic()) > 0:
                self._changed.wait(min(left, WAIT_STEP))
                if self._queue:  # a late hook holds back on_exit: on_exit gets a thread of its own
                    self._leave_late(time.monotonic(), "going on without it")
            runner = self._runner
            if runner is not None and runner.call is not None:
                late = time.monotonic() - runner.since
                log.warning("hook %s has run for %.0f s; exiting without it", runner.call.name, late)

    # -- the hook thread -------------------------------------------------------------------------
    def _start(self) -> None:
        """(lock held) A new thread for the queue."""
        runner = self._runner = _Runner()
        try:
            threading.Thread(target=self._serve, args=(runner,), name="refork-hooks", daemon=True).start()
        except RuntimeError as e:  # no thread to be had (a limit on threads): the calls are dropped
            self._runner = None
            for skipped in self._queue:
                log.error("hook %s not run: %s", skipped.name, e)
            self._queue.clear()

    def _leave_late(self, now: float, then: str) -> None:
        """(lock held) Leave the current thread to its late hook; the queue gets another."""
        runner = self._runner
        if runner is None or runner.call is None or now - runner.since < deadline(runner.call.config):
            return
        log.warning("hook %s has run for %.0f s; %s", runner.call.name, now - runner.since, then)
        self._runner = None
        self._hung.append(runner)
        self._changed.notify_all()
        if not self._queue:
            return
        if len(self._hung) < HUNG_MAX:
            self._start()
            return
        for skipped in self._queue:
            log.warning("hook %s not run: %d earlier hooks still hang", skipped.name, len(self._hung))
        self._queue.clear()

    def _serve(self, runner: _Runner) -> None:
        while True:
            with self._lock:
                if runner.call is not None and runner in self._hung:
                    self._hung.remove(runner)
                    took = time.monotonic() - runner.since
                    log.info("hook %s finished after %.0f s", runner.call.name, took)
                    return
                runner.call = None
                if self._runner is not runner or not self._queue:
                    if self._runner is runner:
                        self._runner = None
                    self._changed.notify_all()
                    return
                call = runner.call = self._queue.popleft()
                runner.since = time.monotonic()
            self._call(call)

    def _prepare(self, num_workers: int, config: Config) -> None:
        server = self.server
        server.config, server.cfg = config, GunicornConfig(config)
        server.num_workers = num_workers

    def _call(self, call: _Call) -> None:
        self._prepare(call.num_workers, call.config)
        try:
            call_logged(call.config, call.name, self.server, *call.extra)
        except BaseException as e:  # sys.exit() in a hook: it ends the hook, not the monitor
            log.error("the %s hook raised %s; carrying on", call.name, type(e).__name__)
