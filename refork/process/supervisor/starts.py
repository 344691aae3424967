"""Starts that fail: where a child was when it died, the immortalization fallback, giving up.

A mixin of the Supervisor (pure, like the rest of the core). Two rules:

- A mold or worker killed by a crash signal (SIGSEGV, SIGBUS, SIGABRT...) while its heap is
  immortal may have met an interpreter whose object layout refork gets wrong: the next mold
  starts without immortalization, once, with one warning naming the interpreter. The immortal
  mold forks no more workers, and the crashes of those it had forked count neither as a crash
  loop nor as a failed start: they are that heap's, and the new mold's workers replace them.
- A server that has never had a ready worker and cannot get one (its mold crashed before any
  worker was ready, or `BOOT_ATTEMPTS` workers in a row died before they were ready) exits 3
  with one line naming the cause and the phase, as gunicorn's "Worker failed to boot" does, so
  systemd or Kubernetes see a failed start. A server that has served before keeps its crash
  back-off instead: a bad deploy is the new generation's problem, not the running one's.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from logging import ERROR, WARNING
from typing import TYPE_CHECKING

from refork.config import Config
from refork.process import messages
from refork.process.supervisor.backoff import Backoff
from refork.process.supervisor.events import Action, AdoptConfig, Log, PrintError, StopMode
from refork.process.supervisor.roster import Child, Roster, exit_description

BOOT_ATTEMPTS = 3  # workers dying before ready, in a row, with none ever ready: the start fails
EARLY = 10.0  # seconds: a crash this soon after a child started counts as a crash at its start
CRASH_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE, signal.SIGSYS,
     signal.SIGTRAP}
)  # fmt: skip
FORKING = "forking workers"  # a ready mold's phase


def crashed(status: int) -> bool:
    """Killed by a signal the process raised itself (a fault, an abort), not one sent to it."""
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) in CRASH_SIGNALS


class Starts:
    """The Supervisor's rules for children that die while starting."""

    config: Config
    roster: Roster
    started: bool
    generation: int
    now: float
    exit_code: int
    worker_crashes: Backoff
    python: str

    if TYPE_CHECKING:  # the Supervisor's

        def _emit(self, action: Action) -> None: ...

        def _begin_stop(self, mode: StopMode, delayed: bool = False) -> None: ...

        def _spawn_mold(self, generation: int, config: Config | None = None) -> None: ...

        def _stop_child(self, child: Child, graceful: bool) -> None: ...

    served = False  # a worker has been ready: from then on, failures back off instead of ending
    immortalize_fallback = False  # molds start without immortalization (a crash showed it unsafe)
    _immortal_generations: frozenset[int] = frozenset()

    def _starting(self, child: Child, report: messages.Starting) -> None:
        child.phase = report.phase

    def _started(self, child: Child, report: messages.Ready) -> None:
        """A child's Ready: a worker means the server serves; a mold remembers its heap."""
        if child.role == "worker":
            self.served = True
        else:
            child.phase = FORKING
            if report.immortalized:
                self._immortal_generations |= {child.generation}

    def _start_failed(self, child: Child, failure: messages.StartFailed) -> None:
        child.failed = failure.reason
        child.phase = failure.phase

    def _crash_at_start(self, child: Child, status: int, lived: float) -> bool:
        """An unexpected exit of a child: True when it ended the server or changed its molds
        (the caller's usual back-off then does not apply)."""
        if crashed(status) and (child.role == "mold" or lived < EARLY) and self._immortal(child):
            self._fall_back(child, status)
            return True
        if self.served:
            return False
        if child.role == "mold":
            if not child.failed and os.WIFSIGNALED(status) and not crashed(status):
                return False  # killed from outside (kill -9, the OOM killer): a fresh mold, backed off
            self._give_up(f"the mold (gen {child.generation}) {self._how(child, status)}")
            return True
        if self.worker_crashes.failures >= BOOT_ATTEMPTS:
            self._give_up(f"worker {child.nr} {self._how(child, status)}")
            return True
        return False

    def _of_abandoned_heap(self, child: Child, status: int) -> bool:
        """A crash of a child of an immortal heap the fallback has already given up."""
        abandoned = self.immortalize_fallback and child.generation in self._immortal_generations
        return abandoned and crashed(status)

    def _immortal(self, child: Child) -> bool:
        """Was this child's heap made immortal (or being made so), with no fallback yet?"""
        if self.immortalize_fallback:
            return False
        preparing = child.role == "mold" and child.phase == messages.HEAP and self.config.immortalize
        return preparing or child.generation in self._immortal_generations

    def _how(self, child: Child, status: int) -> str:
        phase = child.phase or (messages.IMPORTING if child.role == "mold" else "starting")
        if child.failed:
            return f"failed while {phase}: {child.failed}"
        return f"{exit_description(status)} while {phase}"

    def _fall_back(self, child: Child, status: int) -> None:
        """Start the next mold without immortalization (the rest of the heap preparation stays)."""
        self.immortalize_fallback = True
        self.worker_crashes.reset()
        self._emit(
            Log(
                WARNING,
                f"{child.label} (pid {child.pid}) {exit_description(status)} with an immortal heap on "
                f"Python {self.python}: starting a new mold without immortalization "
                "(--no-immortalize); please report this interpreter to refork",
            )
        )
        self.config = replace(self.config, immortalize=False)
        self._emit(AdoptConfig(self.config))
        if self.started:  # a new generation, rolled out like a reload: no worker keeps that heap
            if self.roster.pending_mold() is None:
                self._spawn_mold(self.generation + 1)
            mold = self.roster.current_mold()
            if mold is not None and mold.generation in self._immortal_generations:
                self._stop_child(mold, graceful=True)  # its workers would crash too
        else:
            self._spawn_mold(self.generation)

    def _immortalization_unsafe(self, detail: str) -> None:
        """Before any mold: the monitor's canary showed this interpreter's immortalization broken."""
        if not self.config.immortalize or self.immortalize_fallback:
            return
        self.immortalize_fallback = True
        text = f"{detail} on Python {self.python}: molds will not immortalize the heap"
        self._emit(Log(WARNING, f"{text} (--no-immortalize); please report this interpreter to refork"))
        self.config = replace(self.config, immortalize=False)
        self._emit(AdoptConfig(self.config))

    def _without_immortalization(self, config: Config) -> Config:
        """A config for a new mold, with the fallback applied."""
        if self.immortalize_fallback and config.immortalize:
            return replace(config, immortalize=False)
        return config

    def _give_up(self, cause: str) -> None:
        line = f"no worker could start: {cause}"
        if self.config.error_logfile not in ("-", ""):
            self._emit(Log(ERROR, line))  # the log file says it too
        self._emit(PrintError(f"refork: error: {line}"))
        self.exit_code = 3
        self._begin_stop("fast")
