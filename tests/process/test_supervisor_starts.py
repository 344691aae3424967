"""The supervisor core when children die while starting: the phase in the last line, the exit of
a start that cannot succeed, and the fallback from immortalization after a crash. No process."""

from __future__ import annotations

import signal

from support.supervisor_sim import KILLED, Sim, logged, of, sends, wait_status

from refork.process import messages
from refork.process.supervisor.events import (
    AdoptConfig,
    Boot,
    Exit,
    ForkMold,
    ImmortalizationUnsafe,
    PrintError,
)

SEGV = signal.SIGSEGV  # a wait status: killed by SIGSEGV


def gave_up(actions, line: str, sim: Sim) -> None:
    """The one line, then a fast stop that ends in exit 3."""
    assert of(actions, PrintError) == [PrintError(f"refork: error: no worker could start: {line}")]
    for send in sends(actions, messages.Stop):
        sim.exit(send.pid, wait_status(0))
    assert of(sim.tick(), Exit) == [Exit(3)]


def test_a_mold_killed_by_a_signal_while_importing_ends_the_start_naming_signal_and_phase():
    sim = Sim()
    mold = sim.fork_mold(sim.handle(Boot()))
    sim.handle(messages.Starting(mold, messages.IMPORTING))
    actions = sim.exit(mold, SEGV)
    gave_up(actions, "the mold (gen 0) was killed by SIGSEGV while importing the app", sim)


def test_a_mold_exiting_while_warming_up_ends_the_start():
    sim = Sim()
    mold = sim.fork_mold(sim.handle(Boot()))
    sim.handle(messages.Starting(mold, "warming up the app"))
    line = "the mold (gen 0) exited with code 1 while warming up the app"
    gave_up(sim.exit(mold, wait_status(1)), line, sim)


def test_a_first_mold_killed_from_outside_is_replaced_not_waited_for():
    sim = Sim()
    mold = sim.fork_mold(sim.handle(Boot()))
    sim.exit(mold, KILLED)
    actions = sim.tick()
    assert of(actions, ForkMold) == [ForkMold(0, None)]
    assert of(actions, PrintError) == []


def test_a_mold_crashing_while_preparing_an_immortal_heap_is_retried_without_immortalization():
    sim = Sim(immortalize=True)
    mold = sim.fork_mold(sim.handle(Boot()))
    sim.handle(messages.Starting(mold, messages.HEAP))
    actions = sim.exit(mold, SEGV)
    assert "with an immortal heap on Python" in logged(actions)
    assert "without immortalization" in logged(actions)
    (adopt,) = of(actions, AdoptConfig)
    assert adopt.config.immortalize is False
    assert of(actions, ForkMold) == [ForkMold(0, None)]
    assert of(actions, PrintError) == []
    # the retry crashes too (not immortalized this time): that is the end
    again = sim.fork_mold(actions)
    sim.handle(messages.Starting(again, messages.HEAP))
    gave_up(sim.exit(again, SEGV), "the mold (gen 0) was killed by SIGSEGV while preparing the heap", sim)


def test_a_ready_immortal_mold_that_crashes_before_any_worker_starts_a_new_generation_without_it():
    sim = Sim(immortalize=True)
    mold = sim.fork_mold(sim.handle(Boot()))
    sim.handle(messages.Ready(mold, immortalized=True))
    actions = sim.exit(mold, SEGV)
    assert f"mold gen 0 (pid {mold}) was killed by SIGSEGV with an immortal heap" in logged(actions)
    (fork,) = of(actions, ForkMold)
    assert fork.generation == 1 and sim.sup.config.immortalize is False


def test_workers_of_an_immortal_generation_crashing_at_start_roll_out_a_generation_without_it():
    sim = Sim(immortalize=True)
    mold = sim.fork_mold(sim.handle(Boot()))
    sim.handle(messages.Ready(mold, immortalized=True))
    (worker, _) = sim.spawn_workers(sim.tick(), ready=False)
    actions = sim.exit(worker, SEGV, after=0.5)
    assert f"worker 0 (pid {worker}) was killed by SIGSEGV with an immortal heap" in logged(actions)
    (fork,) = of(actions, ForkMold)
    assert fork.generation == 1
    # the fallback happens once: a later crash is an ordinary crash
    new = sim.fork_mold(actions)
    sim.handle(messages.Ready(new, immortalized=False))
    assert "immortal heap" not in logged(sim.exit(sim.spawn_workers(sim.tick(after=1), ready=False)[0], SEGV))


def test_the_other_workers_of_an_abandoned_immortal_heap_crashing_neither_end_the_start_nor_fork_again():
    sim = Sim(immortalize=True, workers=4)
    mold = sim.fork_mold(sim.handle(Boot()))
    sim.handle(messages.Ready(mold, immortalized=True))
    first, *others = sim.spawn_workers(sim.tick(), ready=False)
    actions = sim.exit(first, SEGV)
    assert sends(actions, messages.Stop, mold)  # its workers would crash too: it forks no more
    new = sim.fork_mold(actions)
    for pid in others:  # forked before the first crash: they crash as well
        actions = sim.exit(pid, SEGV, after=0.1)
        assert of(actions, PrintError) == [] and "crash loop" not in logged(actions)
    assert sends(sim.tick(after=1), messages.SpawnWorker) == []
    sim.handle(messages.Ready(new, immortalized=False))
    assert len(sim.spawn_workers(sim.tick())) == 4


def test_workers_that_never_start_end_the_start_with_the_hook_and_its_error():
    sim = Sim()
    mold = sim.boot()
    actions = sim.tick()
    reason = "AttributeError: 'Config' object has no attribute 'log'"
    for attempt in range(3):
        nrs = [send.message.nr for send in sends(actions, messages.SpawnWorker)]
        pids = sim.spawn_workers(actions, ready=False)
        assert pids, f"attempt {attempt}: no worker was asked for"
        for nr, pid in zip(nrs, pids, strict=True):
            sim.handle(messages.Starting(pid, "running the post_fork hook"))
            sim.handle(messages.StartFailed(pid, "running the post_fork hook", reason))
            actions = sim.exit(pid, wait_status(3))
            if of(actions, PrintError):
                gave_up(actions, f"worker {nr} failed while running the post_fork hook: {reason}", sim)
                assert sim.sup.roster.get(mold) is None
                return
        actions = sim.tick(after=5)
    raise AssertionError("the start was never given up")


def test_a_server_that_has_served_keeps_backing_off_instead_of_exiting():
    sim = Sim()
    sim.up()
    worker = sim.worker(0)
    actions = sim.exit(worker, SEGV, after=5)
    for _ in range(6):
        pids = sim.spawn_workers(sim.tick(after=60), ready=False)
        for pid in pids:
            actions = sim.exit(pid, wait_status(3), after=0.1)
            assert of(actions, PrintError) == []
    assert "crash loop" in logged(actions)
    assert of(sim.tick(), Exit) == []


def test_a_dead_canary_keeps_every_mold_from_immortalizing():
    sim = Sim(immortalize=True)
    actions = sim.handle(ImmortalizationUnsafe("the immortalization canary was killed by SIGSEGV"))
    assert "the immortalization canary was killed by SIGSEGV on Python" in logged(actions)
    (adopt,) = of(actions, AdoptConfig)
    assert adopt.config.immortalize is False
    assert sim.sup.config.immortalize is False
