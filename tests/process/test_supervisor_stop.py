"""The supervisor core, driven with events and no process: readiness, --shutdown-delay and the order
of a graceful stop (docs/deploy.md); the failure table's rows are in test_supervisor.py.
"""

from __future__ import annotations

from support.supervisor_sim import CLEAN, EXIT_1, Sim, logged, of, reload, sends

from refork.process import messages
from refork.process.supervisor.events import Refused, ReloadRequested, StopRequested


# -- readiness, --shutdown-delay, the order of a graceful stop (docs/deploy.md) ------------------
def announced(actions) -> list[str]:
    from refork.process.supervisor.events import Announce

    return [a.milestone for a in of(actions, Announce)]


def test_ready_when_warm_waits_for_every_worker_of_the_generation():
    sim = Sim(workers=2, ready_when="warm")
    sim.boot()
    (w0, w1) = sim.spawn_workers(sim.tick(), ready=False)
    sim.handle(messages.Ready(w0))
    assert announced(sim.tick()) == []
    sim.handle(messages.Ready(w1))
    assert announced(sim.tick()) == ["ready"]
    sim.exit(w0, EXIT_1)
    assert announced(sim.tick()) == []  # once ready, a crash does not flap readiness


def test_ready_when_started_is_the_first_worker():
    sim = Sim(workers=2, ready_when="started")
    sim.boot()
    (w0, _) = sim.spawn_workers(sim.tick(), ready=False)
    sim.handle(messages.Ready(w0))
    assert announced(sim.tick()) == ["ready"]


def test_a_reload_announces_reloading_then_ready_however_it_ends():
    sim = Sim()
    sim.up()
    sim.tick()
    actions = reload(sim)
    assert announced(actions) == ["reloading"]
    new = sim.fork_mold(actions)
    assert announced(sim.tick()) == []
    sim.handle(messages.Ready(new))
    assert announced(sim.tick()) == ["reloaded"]
    new = sim.fork_mold(reload(sim))
    sim.handle(messages.StartFailed(new, messages.IMPORTING, "SyntaxError: bad", False))
    assert announced(sim.tick()) == ["reloaded"]  # systemd waits for READY=1 after RELOADING=1


def test_shutdown_delay_keeps_serving_with_readiness_off_then_stops():
    from refork.process.supervisor.events import CloseListeners

    sim = Sim(workers=2, shutdown_delay=5.0)
    mold, (w0, w1) = sim.up()
    actions = sim.handle(StopRequested("graceful"))
    assert announced(actions) == ["stopping"] and sends(actions, messages.Stop) == []
    assert "serving 5s more with readiness failing (--shutdown-delay)" in logged(actions)
    assert of(sim.handle(ReloadRequested()), Refused) == [Refused("the server is stopping")]
    sim.exit(w0, EXIT_1, after=1.0)  # the delay still keeps the worker count
    (w2,) = sim.spawn_workers(sim.tick())
    assert sends(sim.tick(after=3.0), messages.Stop) == []
    actions = sim.tick(after=1.5)
    assert "graceful stop" in logged(actions) and of(actions, CloseListeners) == [CloseListeners()]
    assert announced(actions) == []  # announced once, at the TERM
    assert [s.pid for s in sends(actions, messages.Stop)] == [mold]  # molds first
    sim.exit(mold, CLEAN)
    assert {s.pid for s in sends(sim.tick(), messages.Stop)} == {w1, w2}


def test_a_second_term_or_an_int_during_the_delay_stops_at_once():
    sim = Sim(workers=1, shutdown_delay=60.0)
    mold, (w0,) = sim.up()
    sim.handle(StopRequested("graceful"))
    actions = sim.handle(StopRequested("graceful"), after=1.0)
    assert "graceful stop requested during --shutdown-delay: stopping now" in logged(actions)
    assert [s.pid for s in sends(actions, messages.Stop)] == [mold]
    sim = Sim(workers=1, shutdown_delay=60.0)
    mold, (w0,) = sim.up()
    sim.handle(StopRequested("graceful"))
    actions = sim.handle(StopRequested("fast"))
    stops = {(s.pid, s.message.graceful) for s in sends(actions, messages.Stop)}
    assert stops == {(mold, False), (w0, False)}


def test_workers_stop_after_a_second_if_a_mold_does_not_exit():
    sim = Sim(workers=1)
    mold, (w0,) = sim.up()
    sim.handle(StopRequested("graceful"))
    assert sends(sim.tick(after=0.5), messages.Stop) == []
    assert [s.pid for s in sends(sim.tick(after=0.6), messages.Stop)] == [w0]


def test_workers_stop_once_the_handshakes_under_way_have_landed():
    """The sealed listeners take no new SYN; a handshake already answered may still complete and
    join the backlog: workers take the backlog only after (see test_shutdown)."""
    from refork.process.supervisor.events import CountHandshakes

    sim = Sim(workers=1, subreaper=False)
    mold, (w0,) = sim.up()
    sim.handshakes = 2
    actions = sim.handle(StopRequested("graceful"))
    assert [s.pid for s in sends(actions, messages.Stop)] == [mold]
    actions = sim.tick(after=0.25)
    assert of(actions, CountHandshakes) == [CountHandshakes()] and sends(actions, messages.Stop) == []
    sim.handshakes = 0
    assert [s.pid for s in sends(sim.tick(after=0.25), messages.Stop)] == [w0]


def test_workers_stop_after_a_second_if_handshakes_do_not_land():
    sim = Sim(workers=1, subreaper=False)
    mold, (w0,) = sim.up()
    sim.handshakes = 1  # a client gone after its SYN: the kernel retries the SYN-ACK for a minute
    sim.handle(StopRequested("graceful"))
    assert sends(sim.tick(after=0.9), messages.Stop) == []
    actions = sim.tick(after=0.2)
    assert [s.pid for s in sends(actions, messages.Stop)] == [w0]
    assert "handshakes still under way after 1s; stopping the workers" in logged(actions)


def test_a_fast_stop_does_not_wait_for_handshakes():
    from refork.process.supervisor.events import CountHandshakes

    sim = Sim(workers=1, subreaper=False)
    mold, (w0,) = sim.up()
    sim.handshakes = 1
    sim.handle(StopRequested("graceful"))
    actions = sim.handle(StopRequested("fast"), after=0.1)
    stops = {(s.pid, s.message.graceful) for s in sends(actions, messages.Stop)}
    assert stops == {(mold, False), (w0, False)}
    actions = sim.tick(after=1.0)
    assert of(actions, CountHandshakes) == [] and "handshakes" not in logged(actions)


def test_without_a_subreaper_workers_stop_with_the_mold():
    sim = Sim(workers=1, subreaper=False)
    mold, (w0,) = sim.up()
    actions = sim.handle(StopRequested("graceful"))
    assert {s.pid for s in sends(actions, messages.Stop)} == {mold, w0}
