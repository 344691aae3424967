"""The supervisor core, driven with events and no process: one test per row of the failure table
in docs/architecture.md ("One loop per role, failures spelled out").

The row "monitor dies" is about processes only (every child sees EOF on its command socket):
tests/process/test_process.py::test_monitor_death_stops_every_child covers it.
"""

from __future__ import annotations

import logging
import signal

import pytest
from support.supervisor_sim import CLEAN, EXIT_1, KILLED, Sim, logged, of, reload, sends, wait_status

from refork.process import messages
from refork.process.forking import backoff_delay
from refork.process.supervisor.events import (
    AdoptConfig,
    Boot,
    ChildExited,
    CloseChannel,
    ConfigReread,
    Exit,
    FilesChanged,
    ForkMold,
    Log,
    PrintError,
    ReforkRequested,
    Refused,
    ReleaseSlot,
    ReloadRequested,
    RereadConfig,
    RunHook,
    SendFailed,
    Signal,
    SlotReading,
    StopRequested,
)
from refork.process.supervisor.rollout import STABLE_AFTER


def test_boot_forks_the_first_mold_and_asks_it_for_every_worker():
    sim = Sim(workers=3, hooks={"when_ready": print})
    mold = sim.fork_mold(sim.handle(Boot()))
    actions = sim.handle(messages.Ready(mold))
    assert [a.name for a in of(actions, RunHook)] == ["when_ready"]
    orders = [s.message for s in sends(sim.tick(), messages.SpawnWorker)]
    assert [(o.nr, o.generation) for o in orders] == [(0, 0), (1, 0), (2, 0)]
    assert len({o.slot for o in orders}) == 3
    assert sends(sim.tick(), messages.SpawnWorker) == []  # asked once, not again while pending


# -- worker dies ---------------------------------------------------------------------------------
def test_dead_worker_is_reaped_released_and_replaced_at_once():
    sim = Sim()
    mold, (w0, w1) = sim.up()
    slot = sim.sup.roster.get(w0).slot
    actions = sim.exit(w0, EXIT_1, after=30.0)
    assert ReleaseSlot(slot) in actions and CloseChannel(w0) in actions
    assert f"worker 0 (pid {w0}, gen 0) exited with code 1" in logged(actions)
    assert "crash loop" not in logged(actions)  # it lived long and was ready
    (order,) = sends(sim.tick(), messages.SpawnWorker, pid=mold)
    assert order.message.nr == 0


def test_crash_loop_backs_off_doubling_and_logs_each_exit():
    sim = Sim()
    mold, (w0, _) = sim.up()
    actions = sim.exit(w0, EXIT_1, after=0.5)  # within a second of its start
    assert (
        "crash loop: worker 0 exited with code 1 0.5s after start; next worker in 0.1s (failure 1 in a row)"
        in (logged(actions))
    )
    assert sends(sim.tick(after=0.05), messages.SpawnWorker) == []  # still backing off
    (pid,) = sim.spawn_workers(sim.tick(after=0.1), ready=False)
    actions = sim.exit(pid, wait_status(3), after=0.1)  # died before it was ready
    assert "next worker in 0.2s (failure 2 in a row)" in logged(actions)
    assert sim.sup.worker_crashes.failures == 2
    assert sends(sim.tick(after=0.1), messages.SpawnWorker) == []
    assert len(sends(sim.tick(after=0.15), messages.SpawnWorker)) == 1
    assert backoff_delay(20) == 30.0  # the ceiling


def test_crash_loop_ends_once_a_new_worker_stays_up_for_stable_after():
    sim = Sim()
    mold, (w0, _) = sim.up()
    sim.exit(w0, KILLED, after=0.2)
    assert "was killed by SIGKILL" in logged(sim.actions)
    sim.spawn_workers(sim.tick(after=1.0))
    sim.tick(after=STABLE_AFTER / 2)
    assert sim.sup.worker_crashes.failures == 1
    sim.tick(after=STABLE_AFTER)
    assert sim.sup.worker_crashes.failures == 0


def test_worker_killed_by_the_monitor_is_no_crash():
    sim = Sim(timeout=30.0)
    mold, (w0, _) = sim.up()
    slot = sim.sup.roster.get(w0).slot
    sim.slots[slot] = SlotReading(w0, deadline=sim.now + 0.5, requests=3)
    assert Signal(w0, signal.SIGABRT) in sim.tick(after=0.6)
    actions = sim.exit(w0, KILLED)
    assert "crash loop" not in logged(actions)
    assert "(timeout: busy longer than 30s)" in logged(actions)


# -- worker hangs --------------------------------------------------------------------------------
def test_hung_worker_past_its_deadline_is_aborted_killed_and_replaced():
    """gunicorn's way: SIGABRT (the worker answers its request blocked in the app with a 500),
    SIGKILL a second later if it is still there."""
    sim = Sim(timeout=30.0)
    mold, (w0, w1) = sim.up()
    slot = sim.sup.roster.get(w0).slot
    sim.slots[slot] = SlotReading(w0, deadline=sim.now + 30.0, requests=7)
    assert of(sim.tick(after=29.0), Signal) == []
    actions = sim.tick(after=2.0)
    assert of(actions, Signal) == [Signal(w0, signal.SIGABRT)]
    assert f"worker 0 (pid {w0}): timeout: busy longer than 30s; aborting it (SIGABRT)" in logged(actions)
    assert of(sim.tick(after=0.5), Signal) == []
    assert of(sim.tick(after=0.6), Signal) == [Signal(w0, signal.SIGKILL)]
    assert of(sim.tick(), Signal) == []  # killed once
    sim.exit(w0, KILLED)
    (order,) = sends(sim.tick(), messages.SpawnWorker)
    assert order.message.nr == 0


def test_a_stale_slot_of_another_pid_is_not_read_as_a_deadline():
    sim = Sim()
    mold, (w0, _) = sim.up()
    slot = sim.sup.roster.get(w0).slot
    sim.slots[slot] = SlotReading(owner=w0 + 999, deadline=sim.now, requests=0)
    assert of(sim.tick(after=60.0), Signal) == []


def test_worker_never_ready_is_killed_after_spawn_timeout():
    sim = Sim(spawn_timeout=10.0)
    sim.boot()
    (w0, _) = sim.spawn_workers(sim.tick(), ready=False)
    actions = sim.tick(after=10.5)
    assert Signal(w0, signal.SIGKILL) in actions
    assert "did not become ready within 10s; killing it" in logged(actions)


# -- mold dies -----------------------------------------------------------------------------------
def test_dead_mold_is_replaced_by_a_fresh_import_and_workers_keep_serving():
    sim = Sim()
    mold, workers = sim.up()
    actions = sim.exit(mold, KILLED, after=60.0)
    assert f"mold (gen 0, pid {mold}) was killed by SIGKILL" in logged(actions)
    assert "starting a new mold from a fresh import; workers keep serving" in logged(actions)
    actions = sim.tick()
    assert of(actions, ForkMold) == [ForkMold(0, None)]
    assert sends(actions, messages.Stop) == []  # the workers are left alone
    new = sim.fork_mold(actions)
    sim.handle(messages.Ready(new))
    assert sim.sup.roster.current_mold().pid == new
    assert sim.sup.mold_crashes.failures == 0


def test_repeated_mold_deaths_back_off():
    sim = Sim()
    mold, workers = sim.up()
    sim.exit(mold, KILLED, after=60.0)
    second = sim.fork_mold(sim.tick())
    actions = sim.exit(second, EXIT_1, after=0.5)  # died while importing
    assert "starting a new mold from a fresh import in 0.2s" in logged(actions)
    assert of(sim.tick(after=0.1), ForkMold) == []
    assert of(sim.tick(after=0.15), ForkMold) == [ForkMold(0, None)]


def test_workers_asked_of_a_mold_that_died_are_asked_of_the_next():
    sim = Sim()
    mold = sim.boot()
    sim.tick()  # two SpawnWorker orders to the mold
    sim.exit(mold, KILLED)
    assert not sim.sup.roster.has_pending_workers()
    new = sim.fork_mold(sim.tick())
    sim.handle(messages.Ready(new))
    assert len(sends(sim.tick(), messages.SpawnWorker, pid=new)) == 2


# -- a worker is needed after --mold-idle-exit stopped the mold ----------------------------------
def idle_server(**overrides):
    sim = Sim(workers=3, mold_idle_exit=5.0, **overrides)
    mold, workers = sim.up()
    actions = sim.tick(after=6.0)
    assert f"mold (gen 0, pid {mold}) idle for 5s; stopping it" in logged(actions)
    assert sends(actions, messages.Stop, pid=mold)[0].message.graceful
    sim.exit(mold, CLEAN)
    assert sim.sup.mold_shed
    return sim, workers


@pytest.mark.parametrize(("workers", "shed"), [(1, False), (2, True)])
def test_by_default_an_idle_mold_is_let_go_when_a_warm_worker_could_replace_it(workers, shed):
    sim = Sim(workers=workers, mold_idle_exit="auto")
    mold, _ = sim.up()
    assert bool(sends(sim.tick(after=2.0), messages.Stop, pid=mold)) == shed


def test_idle_mold_is_kept_without_a_subreaper():
    sim = Sim(mold_idle_exit=5.0, subreaper=False)
    mold, workers = sim.up()
    assert sends(sim.tick(after=60.0), messages.Stop) == []


def test_after_idle_exit_a_needed_worker_comes_from_the_warmest_promoted_worker():
    sim, (w0, w1, w2) = idle_server()
    sim.served(w0, 10)
    sim.served(w1, 50)
    sim.served(w2, 20)
    assert of(sim.tick(after=60.0), ForkMold) == []  # nothing needed: no mold
    sim.exit(w2, EXIT_1)
    actions = sim.tick()
    assert "a worker is needed and the mold was stopped while idle" in logged(actions)
    (promote,) = sends(actions, messages.Promote)
    assert (promote.pid, promote.message.generation) == (w1, 0)  # same generation
    mold = 9001
    sim.handle(messages.Spawned("mold", mold, 0))
    sim.handle(messages.Ready(mold))
    assert not sim.sup.mold_shed
    (order,) = sends(sim.tick(), messages.SpawnWorker, pid=mold)
    assert order.message.nr == 2


def test_after_two_promoted_molds_crash_a_fresh_import_is_used():
    sim, (w0, w1, w2) = idle_server()
    sim.exit(w2, EXIT_1)
    for crashed in (9001, 9002):
        (promote,) = sends(sim.tick(after=1.0), messages.Promote)
        sim.handle(messages.Spawned("mold", crashed, 0))
        sim.exit(crashed, KILLED)
    assert sim.sup.mold_crashes.failures == 2
    actions = sim.tick(after=1.0)
    assert "no worker can be promoted: starting a mold from a fresh import" in logged(actions)
    assert of(actions, ForkMold) == [ForkMold(0, None)]
    assert sends(actions, messages.Promote) == []


# -- the first mold cannot load the app ----------------------------------------------------------
def first_mold_fails(config_error: bool):
    sim = Sim()
    mold = sim.fork_mold(sim.handle(Boot()))
    failure = messages.StartFailed(mold, messages.IMPORTING, "No module named 'nope'", config_error)
    actions = sim.handle(failure)
    assert sends(actions, messages.Stop, pid=mold) == [sends(actions, messages.Stop)[0]]
    assert not sends(actions, messages.Stop)[0].message.graceful  # a fast stop
    assert of(sim.tick(), Exit) == []  # the mold is still there
    sim.exit(mold, wait_status(2))
    return sim, actions, sim.tick()


def test_first_mold_with_a_bad_app_path_exits_2_with_one_line():
    sim, failed, stopped = first_mold_fails(config_error=True)
    assert of(failed, PrintError) == [PrintError("refork: error: No module named 'nope'")]
    assert of(stopped, Exit) == [Exit(2)]
    assert of(sim.tick(), Exit) == []  # said once


def test_first_mold_whose_app_raises_at_import_exits_3_with_one_line():
    sim, failed, stopped = first_mold_fails(config_error=False)
    line = "no worker could start: the mold (gen 0) failed while importing the app: No module named 'nope'"
    assert of(failed, PrintError) == [PrintError(f"refork: error: {line}")]
    assert of(stopped, Exit) == [Exit(3)]


# -- a new mold (HUP, promotion) fails or hangs --------------------------------------------------
def test_new_mold_that_fails_on_reload_keeps_the_current_generation():
    sim = Sim()
    mold, workers = sim.up()
    actions = reload(sim, workers=3)
    (fork,) = of(actions, ForkMold)
    assert fork.generation == 1 and fork.config is not None and fork.config.workers == 3
    new = sim.fork_mold(actions)
    actions = sim.handle(messages.StartFailed(new, messages.IMPORTING, "SyntaxError: bad", False))
    assert "new mold (gen 1) failed to load the app: SyntaxError: bad; keeping gen 0" in logged(actions)
    sim.exit(new, wait_status(3))
    actions = sim.tick()
    assert sim.sup.generation == 0 and sim.sup.target_workers == 2
    assert of(sim.actions, AdoptConfig) == []
    assert sim.sup.roster.current_mold().pid == mold
    assert sends(actions, messages.Stop) == [] and of(actions, ForkMold) == []


def test_a_reload_right_after_a_failed_one_starts_at_once():
    """The failed mold still exiting does not count as "a new mold is already starting"."""
    sim = Sim()
    sim.up()
    new = sim.fork_mold(reload(sim))
    sim.handle(messages.StartFailed(new, messages.IMPORTING, "RuntimeError: broken deploy", False))
    assert sim.sup.roster.pending_mold() is None
    actions = reload(sim)
    assert len(of(actions, ForkMold)) == 1 and "reload ignored" not in logged(actions)


def test_new_mold_that_hangs_is_killed_after_spawn_timeout_plus_60s():
    sim = Sim(spawn_timeout=10.0)
    mold, workers = sim.up()
    new = sim.fork_mold(reload(sim))
    assert of(sim.tick(after=69.0), Signal) == []
    actions = sim.tick(after=2.0)
    assert "new mold (gen 1) did not become ready in time; giving up" in logged(actions)
    assert of(actions, Signal) == [Signal(new, signal.SIGKILL)]
    assert sim.sup.roster.pending_mold() is None
    assert of(sim.handle(ReloadRequested()), RereadConfig)  # a later reload may start


def test_reload_while_a_new_mold_is_starting_follows_it():
    """A HUP during a refork (or another reload) is never lost: it starts once that mold is ready."""
    sim = Sim()
    sim.up()
    new = sim.fork_mold(reload(sim))
    actions = sim.handle(ReloadRequested())
    assert "reload: starts once the mold of gen 1 now starting is ready" in logged(actions)
    assert of(actions, Refused) == [] and of(actions, RereadConfig) == []
    assert of(sim.handle(ReloadRequested()), Log) == []  # asked twice: one reload, said once
    assert of(sim.tick(), RereadConfig) == []
    sim.handle(messages.Ready(new))
    actions = sim.tick()
    assert of(actions, RereadConfig) == [RereadConfig()]
    assert of(sim.tick(), RereadConfig) == []


# -- HUP with a config that fails to parse, validate or run -------------------------------------
def test_hup_with_a_bad_config_changes_nothing():
    sim = Sim()
    mold, workers = sim.up()
    sim.handle(ReloadRequested())
    actions = sim.handle(ConfigReread(error="--workers: not a number"))
    assert of(actions, Log) == [Log(logging.ERROR, "reload: --workers: not a number; nothing changed")]
    assert of(actions, Refused) == [Refused("--workers: not a number; nothing changed")]
    assert of(actions, ForkMold) == [] and sim.sup.roster.pending_mold() is None


def test_a_reloaded_config_is_adopted_only_when_its_mold_is_ready():
    sim = Sim(hooks={"on_reload": print})
    mold, workers = sim.up()
    actions = reload(sim, workers=3, bind=["127.0.0.1:9"])
    text = logged(actions)
    assert "reload: config changed: workers (applied when the new mold is ready)" in text
    assert "reload: bind changed (['127.0.0.1:8000'] -> ['127.0.0.1:9']) but takes a restart" in text
    assert [a.name for a in of(actions, RunHook)] == ["on_reload"]
    new = sim.fork_mold(actions)
    assert sim.sup.config.workers == 2
    actions = sim.handle(messages.Ready(new))
    (adopt,) = of(actions, AdoptConfig)
    assert adopt.config.workers == 3 and adopt.config.bind == ["127.0.0.1:8000"]
    assert "worker count is now 3" in logged(actions)
    assert sends(actions, messages.Stop, pid=mold)  # the old mold goes
    assert sim.sup.generation == 1


def test_reload_without_a_config_source_reuses_the_config():
    sim = Sim()
    sim.up()
    sim.handle(ReloadRequested())
    actions = sim.handle(ConfigReread())
    assert of(actions, ForkMold) == [ForkMold(1, None)]


def test_edited_files_reload_like_hup_and_wait_for_a_reload_in_progress():
    sim = Sim()
    sim.up()
    actions = sim.handle(FilesChanged(("app.py", "b.py")))
    assert "--reload: app.py changed and 1 more file(s)" in logged(actions)
    assert of(actions, RereadConfig)
    sim.handle(ConfigReread())
    assert sim.handle(FilesChanged(("app.py",))) == []


# -- the worker being promoted dies ---------------------------------------------------------------
def test_promoted_worker_killed_before_its_mold_reports_abandons_the_refork():
    """Seen in a chaos run: the refork stayed pending for spawn_timeout + 60 s, and with the current
    mold killed too, nothing replaced it or the workers for that long."""
    sim = Sim(workers=2, spawn_timeout=10.0)
    mold, (w0, w1) = sim.up()
    sim.served(w0, 100)
    (promote,) = sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote, pid=w0)
    sim.exit(w0, KILLED, after=0.1)
    sim.exit(mold, KILLED, after=0.1)
    assert of(sim.tick(after=1.0), ForkMold) == []  # its mold may still report
    actions = sim.tick(after=1.5)
    assert f"worker (pid {w0}) died while being promoted; mold of gen 1 abandoned" in logged(actions)
    assert [f.generation for f in of(actions, ForkMold)] == [0]  # the dead mold is replaced at once
    fresh = sim.fork_mold(actions)
    assert sim.handle(messages.Spawned("mold", 7000, 1)) == [CloseChannel(7000)]  # a late orphan
    sim.handle(messages.Ready(fresh))
    assert sim.sup.roster.current_mold().pid == fresh


def test_promoted_mold_that_reports_after_its_worker_died_is_kept():
    sim = Sim(workers=2)
    mold, (w0, w1) = sim.up()
    sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    promoted = sim.sup.roster.pending_mold().promoted_from
    sim.exit(promoted, KILLED, after=0.1)
    sim.handle(messages.Spawned("mold", 7000, 1), after=0.5)
    sim.handle(messages.Ready(7000))
    sim.tick(after=5.0)
    assert sim.sup.roster.current_mold().pid == 7000 and sim.sup.generation == 1


# -- a promoted mold refuses (--fork-safety strict) ----------------------------------------------
def test_worker_whose_promoted_mold_refused_is_never_promoted_again():
    sim = Sim(workers=2)
    mold, (w0, w1) = sim.up()
    sim.served(w0, 100)
    sim.served(w1, 1)
    actions = sim.handle(ReforkRequested(dict(sim.slots)))
    (promote,) = sends(actions, messages.Promote, pid=w0)
    sim.handle(messages.Spawned("mold", 7000, 1))
    actions = sim.handle(messages.StartFailed(7000, messages.IMPORTING, "a connection is open at fork", True))
    assert f"worker 0 (pid {w0}) will not be promoted again: its mold (gen 1) refused" in logged(actions)
    sim.exit(7000, wait_status(2))
    assert sim.sup.roster.get(w0).fork_unsafe
    assert sim.handle(messages.WantsPromotion(w0, 1000)) == []
    (promote,) = sends(sim.handle(ReforkRequested(dict(sim.slots))), messages.Promote)
    assert promote.pid == w1  # the colder, fork-safe one


def test_refork_refusals_are_answered():
    sim = Sim(subreaper=False)
    sim.up()
    actions = sim.handle(ReforkRequested())
    assert "refork unavailable without a child subreaper" in logged(actions) and of(actions, Refused)
    sim = Sim()
    mold, (w0, w1) = sim.up()
    for pid in (w0, w1):
        sim.handle(messages.ForkUnsafe(pid, "holds a lock"))
    actions = sim.handle(ReforkRequested())
    assert "refork: no fork-safe worker of gen 0 is ready" in logged(actions) and of(actions, Refused)


# -- a child never reports after SpawnWorker -----------------------------------------------------
def test_a_spawn_that_never_reports_expires_and_is_asked_again():
    sim = Sim(workers=1, spawn_timeout=10.0)
    sim.boot()
    (first,) = sends(sim.tick(), messages.SpawnWorker)
    assert sends(sim.tick(after=9.0), messages.SpawnWorker) == []
    actions = sim.tick(after=2.0)
    assert "a worker asked of the mold did not report within 10s" in logged(actions)
    (again,) = sends(actions, messages.SpawnWorker)
    assert again.message.nr == 0
    late = sim.handle(messages.Spawned("worker", 5555, 0, 0, first.message.slot + 100))
    assert late == [CloseChannel(5555)]  # a stale report is refused


def test_an_undeliverable_spawn_order_is_given_back():
    sim = Sim(workers=1)
    mold = sim.boot()
    (order,) = sends(sim.tick(), messages.SpawnWorker)
    sim.handle(SendFailed(mold, order.message))
    assert not sim.sup.roster.spawn_pending(0)
    assert len(sends(sim.tick(), messages.SpawnWorker)) == 1


def test_an_unknown_pid_is_ignored():
    sim = Sim()
    sim.up()
    assert sim.handle(ChildExited(424242, 0)) == []
    assert sim.handle(messages.Ready(424242)) == []


def test_edits_during_a_stop_start_no_reload():
    sim = Sim()
    sim.up()
    sim.handle(StopRequested("graceful"))
    assert not sim.sup.reload_possible
    assert sim.handle(FilesChanged(("app.py",))) == []
