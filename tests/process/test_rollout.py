"""The rollout rules (refork.process.supervisor.rollout) as plain functions: children in, decisions out."""

from __future__ import annotations

from dataclasses import replace

from refork.config import Config
from refork.process import messages
from refork.process.supervisor.backoff import Backoff
from refork.process.supervisor.rollout import (
    STABLE_AFTER,
    crash_loop_over,
    may_promote,
    recycle,
    rollout_limit,
    to_retire,
)
from refork.process.supervisor.roster import Child, Roster


def roster_of(*workers: tuple[int, int, int]) -> Roster:
    """A roster of ready workers, each (pid, nr, generation)."""
    roster = Roster()
    for pid, nr, generation in workers:
        roster.expect_worker(nr, generation, slot=pid, now=0.0)
        child = roster.spawned(messages.Spawned("worker", pid, generation, nr, slot=pid), now=0.0)
        assert child is not None
        child.ready = True
    return roster


def test_rollout_limit_is_refork_max_unavailable_else_a_tenth_of_the_workers():
    config = Config()
    assert rollout_limit(replace(config, refork_max_unavailable=3), 20) == 3
    assert rollout_limit(replace(config, refork_max_unavailable=0), 25) == 3
    assert rollout_limit(replace(config, refork_max_unavailable=0), 2) == 1


def test_to_retire_counts_workers_already_in_transition_against_the_limit():
    workers = [Child(pid, "worker", 0, nr) for pid, nr in ((10, 0), (11, 1), (12, 2), (13, 3))]
    workers[0].stopping = True  # one old worker on its way out
    assert to_retire(workers, 1, limit=2) == [workers[1]]
    workers[1].retire_reason = "replaced by gen 1"
    assert to_retire(workers, 1, limit=2) == []
    assert to_retire(workers, 1, limit=4) == [workers[2], workers[3]]
    assert to_retire(workers, 0, limit=4) == []  # nothing is outdated in its own generation


def test_recycle_stops_a_retiring_worker_once_its_replacement_is_ready():
    roster = roster_of((10, 0, 0), (20, 0, 1))
    old = roster.get(10)
    assert old is not None
    old.retire_reason = "replaced by gen 1"
    assert recycle(roster, may_spawn=True) == [(old, True)]
    new = roster.get(20)
    assert new is not None
    new.ready = False
    assert recycle(roster, may_spawn=True) == []  # the replacement exists: wait for it


def test_recycle_asks_for_one_replacement_per_number_and_only_when_it_may_spawn():
    roster = roster_of((10, 0, 0), (11, 1, 0))
    first, second = roster.get(10), roster.get(11)
    assert first is not None and second is not None
    first.retire_reason = second.retire_reason = "max requests"
    assert recycle(roster, may_spawn=False) == []
    assert recycle(roster, may_spawn=True) == [(first, False), (second, False)]
    roster.expect_worker(0, 0, slot=5, now=0.0)  # already asked of the mold
    assert recycle(roster, may_spawn=True) == [(second, False)]


def test_crash_loop_ends_when_a_worker_started_after_the_last_crash_stays_ready():
    crashes = Backoff()
    assert not crash_loop_over([], crashes, now=100.0)
    crashes.failed(10.0)
    worker = Child(10, "worker", 0, 0, started=11.0, ready=True, ready_at=12.0)
    assert not crash_loop_over([worker], crashes, now=12.0 + STABLE_AFTER / 2)
    assert crash_loop_over([worker], crashes, now=12.0 + STABLE_AFTER * 2)
    worker.started = 9.0  # it predates the crash: it proves nothing
    assert not crash_loop_over([worker], crashes, now=12.0 + STABLE_AFTER * 2)


def test_a_worker_is_not_promoted_while_a_rollout_or_a_mold_is_under_way():
    roster = roster_of((10, 0, 1))
    worker = roster.get(10)
    assert worker is not None
    assert may_promote(worker, roster, 1)
    assert not may_promote(worker, roster, 2)  # not of the current generation
    roster.expect_mold(2, now=0.0)
    assert not may_promote(worker, roster, 1)
    roster.clear_pending_mold()
    worker.fork_unsafe = "a thread"
    assert not may_promote(worker, roster, 1)
    rolling = roster_of((10, 0, 1), (11, 1, 0))  # a gen-0 worker is still serving
    current = rolling.get(10)
    assert current is not None and not may_promote(current, rolling, 1)
