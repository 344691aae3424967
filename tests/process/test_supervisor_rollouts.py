"""The supervisor core, driven with events and no process: rollouts, recycling, scaling, stops."""

from __future__ import annotations

import signal

from support.supervisor_sim import CLEAN, Sim, logged, of, sends

from refork.memory.accounting import ProcessMemory
from refork.process import messages
from refork.process.supervisor.events import (
    ConfigReread,
    Exit,
    MemorySampled,
    ReforkRequested,
    ReloadRequested,
    ReopenLogFiles,
    ReopenLogsRequested,
    SampleMemory,
    SendFailed,
    SetWorkerCount,
    Signal,
    SlotReading,
    StopRequested,
)


# -- rollouts ------------------------------------------------------------------------------------
def test_hup_rollout_replaces_one_worker_at_a_time_and_stops_the_old_after_its_replacement():
    sim = Sim(workers=3)
    old_mold, old = sim.up()
    sim.handle(ReloadRequested())
    new_mold = sim.fork_mold(sim.handle(ConfigReread()))
    actions = sim.handle(messages.Ready(new_mold))
    assert sends(actions, messages.Stop, pid=old_mold)  # the old mold goes at once
    sim.exit(old_mold, CLEAN)
    for nr in range(3):
        actions = sim.tick()
        (order,) = sends(actions, messages.SpawnWorker, pid=new_mold)  # one at a time
        assert (order.message.nr, order.message.generation) == (nr, 1)
        (new,) = sim.spawn_workers(actions, ready=False)
        assert sends(sim.tick(), messages.Stop) == []  # not before its replacement is ready
        sim.handle(messages.Ready(new))
        (stop,) = sends(sim.tick(), messages.Stop)
        assert stop.pid == old[nr] and stop.message.graceful
        sim.exit(old[nr], CLEAN)
    assert {c.generation for c in sim.sup.roster.workers()} == {1}
    assert sends(sim.tick(), messages.SpawnWorker) == []


def test_refork_rollout_replaces_refork_max_unavailable_at_a_time():
    sim = Sim(workers=5, refork_max_unavailable=2)
    mold, old = sim.up()
    sim.served(old[3], 99)
    (promote,) = sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    assert promote.pid == old[3] and promote.message.generation == 1
    assert "promoting worker 3" in logged(sim.actions) and "99 requests" in logged(sim.actions)
    new_mold = 8000
    sim.handle(messages.Spawned("mold", new_mold, 1))
    sim.handle(messages.Ready(new_mold))
    actions = sim.tick()
    assert [s.message.nr for s in sends(actions, messages.SpawnWorker, pid=new_mold)] == [0, 1]
    assert sim.sup.rollout_limit == 2


def test_refork_rollout_defaults_to_a_tenth_of_the_workers():
    sim = Sim(workers=20)
    sim.up()
    assert sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    assert sim.sup.rollout_limit == 2


def test_refork_after_is_ignored_during_a_rollout_or_a_pending_mold():
    sim = Sim(workers=2)
    mold, (w0, w1) = sim.up()
    (promote,) = sends(sim.handle(messages.WantsPromotion(w0, 1000)), messages.Promote)
    assert sim.handle(messages.WantsPromotion(w1, 1000)) == []  # a mold is already coming
    sim.handle(messages.Spawned("mold", 8000, 1))
    sim.handle(messages.Ready(8000))
    assert sim.handle(messages.WantsPromotion(w1, 1000)) == []  # gen 0 is outdated now


# -- recycling -----------------------------------------------------------------------------------
def test_max_requests_retires_a_worker_after_its_replacement_is_ready():
    sim = Sim(workers=2)
    mold, (w0, w1) = sim.up()
    actions = sim.handle(messages.WantsRetirement(w1, "served 1000 requests (--max-requests)"))
    assert f"worker 1 (pid {w1}) served 1000 requests (--max-requests); replacing it" in logged(actions)
    assert sim.handle(messages.WantsRetirement(w1, "again")) == []  # once
    actions = sim.tick()
    (new,) = sim.spawn_workers(actions, ready=False)
    assert sends(sim.tick(), messages.Stop) == []
    sim.handle(messages.Ready(new))
    (stop,) = sends(sim.tick(), messages.Stop)
    assert stop.pid == w1
    assert sim.sup.roster.get(w1).stopping


def test_memory_over_the_limit_retires_the_worker():
    sim = Sim(workers=1, max_worker_memory=100 << 20, memory_metric="uss", memory_interval=10.0)
    mold, (w0,) = sim.up()
    (sample,) = of(sim.tick(after=10.0), SampleMemory)
    assert set(sample.pids) == {mold, w0}
    assert of(sim.tick(after=1.0), SampleMemory) == []  # at most once per interval

    def memory(pid: int, uss: int) -> ProcessMemory:
        return ProcessMemory(pid, rss=uss, pss=uss, uss=uss, private_dirty=uss, shared=0, swap=0, minflt=0)

    big = {mold: memory(mold, 500 << 20), w0: memory(w0, 150 << 20)}
    assert sim.handle(MemorySampled(big, check_limit=False)) == []  # `refork status` only looks
    actions = sim.handle(MemorySampled(big))
    assert f"worker 0 (pid {w0}): USS 150.0M over --max-worker-memory 100.0M; replacing it" in logged(actions)
    assert sim.sup.roster.get(w0).retire_reason
    assert sim.sup.roster.get(mold).retire_reason is None  # molds are not recycled
    assert len(sends(sim.tick(), messages.SpawnWorker)) == 1


# -- TTIN / TTOU ---------------------------------------------------------------------------------
def test_worker_count_is_clamped_and_extra_workers_are_stopped():
    sim = Sim(workers=2, capacity=16)
    mold, (w0, w1) = sim.up()
    actions = sim.handle(SetWorkerCount(100))
    assert "at most 8 workers for this monitor (restart with -w to go higher)" in logged(actions)
    assert sim.sup.target_workers == 8
    assert len(sends(sim.tick(), messages.SpawnWorker)) == 6
    sim.handle(SetWorkerCount(0))
    assert sim.sup.target_workers == 1
    assert "worker count is now 1" in logged(sim.actions)
    stopped = {s.pid for s in sends(sim.tick(), messages.Stop)}
    assert w0 not in stopped and w1 in stopped


# -- stopping ------------------------------------------------------------------------------------
def test_graceful_stop_asks_everyone_then_kills_at_the_deadline_then_exits():
    sim = Sim(workers=2, graceful_timeout=30.0)
    mold, (w0, w1) = sim.up()
    actions = sim.handle(StopRequested("graceful"))
    assert "graceful stop: 3 process(es) to stop" in logged(actions)
    # the mold first (it holds the listeners too); the workers once it is gone (they take the backlog)
    assert {(s.pid, s.message.graceful) for s in sends(actions, messages.Stop)} == {(mold, True)}
    assert {(s.pid, s.message.graceful) for s in sends(sim.tick(after=1.5), messages.Stop)} == {
        (w0, True),
        (w1, True),
    }
    sim.exit(w0, CLEAN, after=1.0)
    assert of(sim.tick(after=1.0), Signal) == [] and sends(sim.tick(), messages.SpawnWorker) == []
    actions = sim.tick(after=28.0)
    assert set(of(actions, Signal)) == {Signal(mold, signal.SIGKILL), Signal(w1, signal.SIGKILL)}
    assert "did not stop in time; killing it" in logged(actions)
    sim.exit(mold, signal.SIGKILL)
    assert of(sim.tick(), Exit) == []
    sim.exit(w1, signal.SIGKILL)
    assert of(sim.tick(), Exit) == [Exit(0)]


def test_fast_stop_overrides_graceful_and_kills_after_a_second():
    sim = Sim(workers=1, graceful_timeout=30.0)
    mold, (w0,) = sim.up()
    sim.handle(StopRequested("graceful"))
    assert sim.handle(StopRequested("graceful")) == []  # already
    actions = sim.handle(StopRequested("fast"))
    assert {(s.pid, s.message.graceful) for s in sends(actions, messages.Stop)} == {
        (mold, False),
        (w0, False),
    }
    assert sim.handle(StopRequested("graceful")) == []  # fast wins
    assert set(of(sim.tick(after=1.5), Signal)) == {Signal(mold, signal.SIGKILL), Signal(w0, signal.SIGKILL)}


def test_an_undeliverable_stop_becomes_a_signal():
    sim = Sim(workers=1)
    mold, (w0,) = sim.up()
    assert sim.handle(SendFailed(w0, messages.Stop(True))) == [Signal(w0, signal.SIGTERM)]
    assert sim.handle(SendFailed(w0, messages.Stop(False))) == [Signal(w0, signal.SIGKILL)]


def test_usr1_reopens_log_files_everywhere():
    sim = Sim(workers=1)
    mold, (w0,) = sim.up()
    actions = sim.handle(ReopenLogsRequested())
    assert actions[0] == ReopenLogFiles()
    assert {s.pid for s in sends(actions, messages.ReopenLogs)} == {mold, w0}


# -- open WebSockets of a retired worker (--ws-drain-timeout) -----------------------------------
def test_a_worker_retired_by_a_refork_serves_its_websockets_on_without_holding_the_rollout():
    sim = Sim(workers=2, refork_max_unavailable=1, graceful_timeout=5.0, ws_drain_timeout=60.0)
    mold, (w0, w1) = sim.up()
    assert sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    sim.handle(messages.Spawned("mold", 8000, 1))
    sim.handle(messages.Ready(8000))
    sim.spawn_workers(sim.tick())
    (stop,) = [s for s in sends(sim.tick(), messages.Stop) if s.pid in (w0, w1)]
    assert stop.message.graceful and stop.message.websockets == 60.0
    retired = sim.sup.roster.get(stop.pid)
    assert retired is not None
    sim.slots[retired.slot] = SlotReading(stop.pid, 0.0, 0, websockets=1)
    actions = sim.tick()
    assert [s.message.nr for s in sends(actions, messages.SpawnWorker)] == [1 - retired.nr]  # meanwhile
    sim.spawn_workers(actions)
    (other,) = [s for s in sends(sim.tick(), messages.Stop) if s.pid in (w0, w1)]
    assert other.message.websockets == 60.0
    assert not sim.sup.roster.rollout_in_progress(1)  # the next refork may come
    sim.exit(other.pid, CLEAN)  # (it had no WebSocket open)
    assert "killing" not in logged(sim.tick(after=30.0))  # past --graceful-timeout: WebSockets open
    assert f"(pid {stop.pid}): still running" in logged(sim.tick(after=40.0))  # past the drain limit


def test_a_reload_or_a_stop_gives_no_websocket_grace():
    sim = Sim(workers=1, ws_drain_timeout=60.0)
    mold, (w0,) = sim.up()
    sim.handle(ReloadRequested())
    new_mold = sim.fork_mold(sim.handle(ConfigReread()))
    sim.handle(messages.Ready(new_mold))
    sim.spawn_workers(sim.tick())
    (stop,) = sends(sim.tick(), messages.Stop, pid=w0)
    assert stop.message.websockets == 0.0  # the new code takes over at once
    stops = sends(sim.handle(StopRequested("graceful")), messages.Stop)
    assert stops and all(s.message.websockets == 0.0 for s in stops)


# -- a hung request under --threads ----------------------------------------------------------------
def hung_threaded_worker(graceful: float = 5.0) -> tuple[Sim, int, list]:
    """A worker with 4 app threads whose oldest request passed --timeout (30 s) just now."""
    sim = Sim(workers=2, timeout=30.0, graceful_timeout=graceful)
    mold, (w0, w1) = sim.up()
    slot = sim.sup.roster.get(w0).slot
    sim.slots[slot] = SlotReading(w0, sim.now + 30.0, 7, busy=2, threads=4)
    assert of(sim.tick(after=29.0), Signal) == []
    return sim, w0, sim.tick(after=2.0)


def test_a_threaded_worker_past_its_timeout_drains_before_it_is_killed():
    """Its loop is not the stuck thread: the hung request costs only itself. The worker stops
    accepting and its replacement is asked for at once; its other requests get --graceful-timeout,
    then it is killed for its timeout."""
    sim, w0, actions = hung_threaded_worker()
    assert f"worker 0 (pid {w0}): timeout: busy longer than 30s; draining it" in logged(actions)
    assert of(actions, Signal) == []
    (stop,) = sends(actions, messages.Stop)
    assert stop.pid == w0 and stop.message.graceful
    (order,) = sends(actions, messages.SpawnWorker)
    assert order.message.nr == 0  # the replacement, in the same tick
    assert of(sim.tick(after=4.0), Signal) == []
    actions = sim.tick(after=1.5)
    assert of(actions, Signal) == [Signal(w0, signal.SIGABRT)]
    assert "timeout: busy longer than 30s, drained for --graceful-timeout 5s; aborting it" in logged(actions)
    sim.exit(w0, signal.SIGKILL)
    assert sim.sup.restarts == {"timeout": 1}


def test_a_draining_hung_worker_that_exits_on_its_own_is_not_killed():
    sim, w0, _ = hung_threaded_worker()
    sim.exit(w0, CLEAN, after=1.0)
    assert of(sim.tick(after=10.0), Signal) == []
    assert sim.sup.restarts == {"timeout": 1}


def test_a_single_threaded_worker_past_its_timeout_is_aborted_at_once():
    """Its only thread (or its event loop) is the stuck one: nothing could drain."""
    sim = Sim(workers=1, timeout=30.0)
    mold, (w0,) = sim.up()
    slot = sim.sup.roster.get(w0).slot
    sim.slots[slot] = SlotReading(w0, sim.now + 30.0, 7, busy=1, threads=1)
    assert of(sim.tick(after=31.0), Signal) == [Signal(w0, signal.SIGABRT)]
