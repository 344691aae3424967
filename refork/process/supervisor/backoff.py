"""Crash-loop back-off: consecutive failures, and when the next attempt may start."""

from __future__ import annotations

from dataclasses import dataclass

from refork.process.forking import backoff_delay


@dataclass
class Backoff:
    """0.1 s doubling to 30 s per failure in a row (refork.process.forking.backoff_delay)."""

    first_free: bool = False  # the first failure is retried at once (a mold: workers keep serving)
    failures: int = 0
    last_failure_at: float = 0.0
    next_at: float = 0.0  # no attempt before this (monotonic seconds)

    def failed(self, now: float) -> float:
        """Count one more failure at `now`; return the delay before the next attempt."""
        self.failures += 1
        self.last_failure_at = now
        delay = 0.0 if self.first_free and self.failures == 1 else backoff_delay(self.failures)
        self.next_at = now + delay
        return delay

    def reset(self) -> None:
        self.failures = 0
