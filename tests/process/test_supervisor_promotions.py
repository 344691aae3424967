"""The supervisor core, driven with events and no process: which worker is promoted, and what
follows when it finds no safe point in time (PromotionDeclined)."""

from __future__ import annotations

from support.supervisor_sim import CLEAN, EXIT_1, KILLED, Sim, logged, of, sends

from refork.process import messages
from refork.process.supervisor.events import ForkMold, ReforkRequested, SlotReading
from refork.process.supervisor.promotions import REFORK_TRIES
from refork.process.supervisor.roster import DECLINED_PAUSE


def declined(sim: Sim, pid: int, generation: int = 1) -> list:
    return sim.handle(messages.PromotionDeclined(pid, generation, "no safe point within 3s"))


def in_the_app(sim: Sim, pid: int, requests: int, since: float, timeout: float, overdue: int = 0) -> None:
    """The slot of a worker with a request in the app since `since` seconds ago."""
    slot = sim.sup.roster.get(pid).slot
    sim.slots[slot] = SlotReading(pid, sim.now - since + timeout, requests, busy=1, overdue=overdue)


def test_a_declined_refork_asks_the_next_warmest_worker_at_once_then_gives_up():
    """A refork under steady load is never stuck: each worker that finds no safe point in time
    declines, the monitor asks the next warmest, and after REFORK_TRIES the refork is given up."""
    sim = Sim(workers=4)
    mold, workers = sim.up()
    for pid, served in zip(workers, (40, 30, 20, 10), strict=True):
        sim.served(pid, served)
    (promote,) = sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    asked = [promote.pid]
    for _ in range(REFORK_TRIES - 1):
        actions = declined(sim, asked[-1])
        assert f"pid {asked[-1]}) not promoted to mold of gen 1" in logged(actions)
        (promote,) = sends(actions, messages.Promote)
        assert promote.message.generation == 1 and sim.sup.roster.pending_mold() is not None
        asked.append(promote.pid)
    assert asked == workers[:REFORK_TRIES]  # the warmest first, none asked twice
    actions = declined(sim, asked[-1])
    assert "refork to gen 1 given up: no worker reached a safe point in time" in logged(actions)
    assert sends(actions, messages.Promote) == [] and sim.sup.roster.pending_mold() is None
    assert sends(sim.tick(after=DECLINED_PAUSE), messages.Promote) == []  # given up: not retried
    (promote,) = sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)  # a new ask
    assert promote.pid == workers[0]  # its pause is over


def test_a_declined_refork_with_no_other_worker_is_retried_once_the_pause_is_over():
    sim = Sim(workers=1)
    mold, (w0,) = sim.up()
    sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    assert sends(declined(sim, w0), messages.Promote) == []
    assert sends(sim.tick(after=DECLINED_PAUSE / 2), messages.Promote) == []
    (promote,) = sends(sim.tick(after=DECLINED_PAUSE / 2), messages.Promote)
    assert (promote.pid, promote.message.generation) == (w0, 1)
    sim.handle(messages.Spawned("mold", 8000, 1))
    sim.handle(messages.Ready(8000))
    assert sim.sup.refork_tries == 0  # done: a later decline of gen 2 would not retry this one


def test_a_worker_with_a_request_near_its_timeout_is_never_promoted():
    """Promoting a worker whose request is hung gets it killed mid-promotion (or declined): a worker
    with a request in the app past half of --timeout, or past --request-timeout, is left out."""
    sim = Sim(workers=3, timeout=10.0)
    mold, (w0, w1, w2) = sim.up()
    in_the_app(sim, w0, 300, since=6.0, timeout=10.0)  # the warmest, but in the app for 6 of its 10 s
    in_the_app(sim, w1, 200, since=1.0, timeout=10.0, overdue=1)  # past --request-timeout
    in_the_app(sim, w2, 100, since=4.0, timeout=10.0)
    (promote,) = sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    assert promote.pid == w2


def test_an_idle_worker_is_healthy_whatever_its_last_heartbeat():
    sim = Sim(workers=1, timeout=2.0)
    mold, (w0,) = sim.up()
    slot = sim.sup.roster.get(w0).slot
    sim.slots[slot] = SlotReading(w0, sim.now + 0.5, 10, busy=0)  # its loop ticked 1.5 s ago
    assert sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)


def idle_mold_shed(workers: int = 3, timeout: float = 30.0) -> tuple[Sim, list[int]]:
    sim = Sim(workers=workers, mold_idle_exit=5.0, timeout=timeout)
    mold, pids = sim.up()
    sends(sim.tick(after=6.0), messages.Stop, pid=mold)
    sim.exit(mold, CLEAN)
    assert sim.sup.mold_shed
    return sim, pids


def test_a_killed_worker_is_replaced_by_promoting_a_healthy_worker_not_a_hung_one():
    """The flood of hung requests: with the mold shed, a killed worker's replacement came from a
    promoted worker that was itself hung; it was killed mid-promotion, then a cold import, again."""
    sim, (w0, w1, w2) = idle_mold_shed(timeout=2.0)
    in_the_app(sim, w1, 500, since=1.5, timeout=2.0)  # the warmest: hung
    in_the_app(sim, w2, 100, since=0.2, timeout=2.0)
    sim.exit(w0, KILLED)
    actions = sim.tick()
    (promote,) = sends(actions, messages.Promote)
    assert (promote.pid, promote.message.generation) == (w2, 0)
    assert of(actions, ForkMold) == []


def test_with_every_worker_hung_a_killed_worker_is_replaced_by_a_fresh_import():
    sim, (w0, w1, w2) = idle_mold_shed(timeout=2.0)
    in_the_app(sim, w1, 500, since=1.5, timeout=2.0)
    in_the_app(sim, w2, 100, since=1.2, timeout=2.0)
    sim.exit(w0, EXIT_1)
    actions = sim.tick()
    assert "no worker can be promoted: starting a mold from a fresh import" in logged(actions)
    assert of(actions, ForkMold) == [ForkMold(0, None)] and sends(actions, messages.Promote) == []


def test_a_summoned_worker_that_declines_is_followed_by_another_at_the_next_tick():
    sim, (w0, w1, w2) = idle_mold_shed()
    sim.served(w1, 50)
    sim.served(w2, 20)
    sim.exit(w0, EXIT_1)
    (promote,) = sends(sim.tick(), messages.Promote)
    assert promote.pid == w1
    assert sends(declined(sim, w1, generation=0), messages.Promote) == []  # no refork retry for it
    (promote,) = sends(sim.tick(), messages.Promote)
    assert (promote.pid, promote.message.generation) == (w2, 0)


def test_a_declined_refork_after_promotion_is_not_retried_by_the_monitor():
    """--refork-after: the worker asks again itself once it can; nothing is given up."""
    sim = Sim(workers=2)
    mold, (w0, w1) = sim.up()
    (promote,) = sends(sim.handle(messages.WantsPromotion(w0, 1000)), messages.Promote)
    actions = declined(sim, w0)
    assert sends(actions, messages.Promote) == [] and "given up" not in logged(actions)
    assert sends(sim.tick(after=DECLINED_PAUSE), messages.Promote) == []
