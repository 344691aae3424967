"""Replacing workers: how many at once, which retire now, and what a retiring worker waits for.

Pure functions of the roster: they say what to do and the supervisor does it (marks, stops,
spawns), so the rules of a rollout read, and can be tested, apart from the events that drive them.
A worker retires (a new generation, --max-requests, --max-worker-memory) by first getting a
replacement under its number; it stops only once that replacement is ready, so capacity never dips.
"""

from __future__ import annotations

import math

from refork.config import Config
from refork.process.supervisor.backoff import Backoff
from refork.process.supervisor.roster import Child, Roster

STABLE_AFTER = 5.0  # a worker alive this long ends a crash loop


def rollout_limit(config: Config, target_workers: int) -> int:
    """Outdated workers replaced at once after a refork: --refork-max-unavailable, else a tenth."""
    if config.refork_max_unavailable:
        return max(1, config.refork_max_unavailable)
    return max(1, math.ceil(target_workers * 0.1))


def to_retire(workers: list[Child], generation: int, limit: int) -> list[Child]:
    """Workers of older generations to retire now: at most `limit` in transition at a time."""
    outdated = [c for c in workers if c.generation < generation and not c.stopping]
    in_transition = sum(1 for c in workers if c.generation < generation and c.stopping
                        and not c.websockets_until)  # (replaced, serving its WebSockets on)  # fmt: skip
    in_transition += sum(1 for c in outdated if c.retire_reason is not None)
    fresh = [c for c in outdated if c.retire_reason is None]
    return fresh[: max(0, limit - in_transition)]


def recycle(roster: Roster, may_spawn: bool) -> list[tuple[Child, bool]]:
    """Retiring workers to act on, in order: True, its replacement is ready (stop it); False, it
    has none yet and one may be spawned now (`may_spawn`: a mold is usable, no crash back-off)."""
    due: list[tuple[Child, bool]] = []
    spawning: set[int] = set()
    for child in roster.workers():
        if child.retire_reason is None or child.stopping:
            continue
        replacement = [c for c in roster.serving_workers() if c.nr == child.nr]
        if any(c.ready for c in replacement):
            due.append((child, True))
        elif (
            not replacement and may_spawn and not roster.spawn_pending(child.nr) and child.nr not in spawning
        ):
            spawning.add(child.nr)
            due.append((child, False))
    return due


def crash_loop_over(workers: list[Child], crashes: Backoff, now: float) -> bool:
    """A worker started after the last crash has been ready for STABLE_AFTER: the loop is over."""
    return bool(crashes.failures) and any(
        c.ready and now - c.ready_at > STABLE_AFTER and c.started > crashes.last_failure_at for c in workers
    )


def may_promote(worker: Child, roster: Roster, generation: int) -> bool:
    """--refork-after: a serving worker of the current generation, while no mold is coming and no
    rollout is under way (a refork now would start a rollout over an unfinished one)."""
    return not (
        worker.stopping
        or worker.fork_unsafe
        or not worker.ready
        or worker.generation != generation
        or roster.pending_mold() is not None
        or roster.rollout_in_progress(generation)
    )
