"""The worker's deadline counts time in the app only (AppClock), without processes or sockets.

Every test runs twice: with the slot written by refork._native.SlotWords (where the extension is
built) and by the clock's own Python writes; and the two must leave the very same words.
"""

from __future__ import annotations

import pytest

import refork.process.slots as slots_module
from refork import _native
from refork.process.slots import AppClock, Slots


@pytest.fixture(autouse=True, params=["native", "python"])
def writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which writes the clocks made in the test use."""
    monkeypatch.setattr(slots_module, "SlotWords", _native.SlotWords if request.param == "native" else None)
    return str(request.param)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[AppClock, Slots, Clock]:
    slots = Slots(1)
    clock = Clock()
    return AppClock(slots, 0, 30.0, clock), slots, clock


def test_a_request_in_the_app_holds_the_deadline_from_when_it_entered() -> None:
    app_clock, slots, clock = make()
    token = app_clock.started()
    assert slots.deadline(0) == 130.0
    clock.now = 120.0
    app_clock.tick()  # a tick does not push a held deadline
    assert slots.deadline(0) == 130.0
    app_clock.finished(token)
    assert slots.deadline(0) == 150.0 and not app_clock.busy


def test_waiting_on_the_client_releases_the_deadline_until_back_in_the_app() -> None:
    app_clock, slots, clock = make()
    token = app_clock.started()
    clock.now = 110.0
    app_clock.waiting(token)  # e.g. a slow reader: not the app's time
    assert not app_clock.busy and slots.deadline(0) == 140.0
    clock.now = 500.0
    app_clock.tick()
    assert slots.deadline(0) == 530.0  # no kill however long the client takes
    clock.now = 501.0
    app_clock.resumed(token)
    assert app_clock.busy and slots.deadline(0) == 531.0  # counted again from re-entry
    app_clock.finished(token)
    assert not app_clock.busy


def test_with_threads_the_oldest_request_in_the_app_sets_the_deadline() -> None:
    app_clock, slots, clock = make()
    first = app_clock.started()
    clock.now = 105.0
    second = app_clock.started()
    assert slots.deadline(0) == 130.0
    clock.now = 106.0
    app_clock.waiting(first)
    assert slots.deadline(0) == 135.0  # the second one's start
    app_clock.resumed(first)
    assert slots.deadline(0) == 135.0  # first re-entered at 106: the second is older
    app_clock.finished(second)
    assert slots.deadline(0) == 136.0


def test_a_resume_after_the_request_finished_is_ignored() -> None:
    app_clock, _, _ = make()
    token = app_clock.started()
    app_clock.waiting(token)
    app_clock.finished(token)
    app_clock.resumed(token)  # an ASGI receive() woken by the disconnect, after the cycle ended
    assert not app_clock.busy


def test_it_counts_the_requests_served_in_the_slot() -> None:
    app_clock, slots, _ = make()
    assert app_clock.finished(app_clock.started()) == 1
    assert app_clock.finished(app_clock.started()) == 2
    assert slots.requests(0) == 2


# -- soft deadlines (--request-timeout) and refork.extend_deadline() ---------------------------------


def test_an_overdue_request_is_returned_once_and_counted_hung_until_it_finishes() -> None:
    app_clock, slots, clock = make()
    hung = app_clock.started("GET", b"/hang")
    clock.now = 101.0
    quick = app_clock.started("GET", b"/quick")
    clock.now = 102.0
    assert app_clock.overdue(2.0) == []  # exactly 2s: not past it
    clock.now = 102.5
    assert app_clock.overdue(2.0) == [hung]
    assert app_clock.overdue(2.0) == []  # logged once, not every tick
    assert app_clock.hung == 1
    app_clock.finished(quick)
    assert slots.deadline(0) == 130.0  # the hung one still holds the hard deadline
    clock.now = 200.0
    app_clock.finished(hung)
    assert app_clock.hung == 0 and not app_clock.busy
    assert slots.deadline(0) == 230.0


def test_overdue_tokens_carry_who_and_where() -> None:
    app_clock, _slots, clock = make()
    app_clock.started("POST", b"/export")
    clock.now = 110.0
    [token] = app_clock.overdue(5.0) or []
    assert (token.method, token.path, token.began) == ("POST", b"/export", 100.0)


def test_time_waiting_on_the_client_is_not_counted_for_the_soft_deadline() -> None:
    app_clock, _slots, clock = make()
    token = app_clock.started()
    clock.now = 101.0
    app_clock.waiting(token)
    clock.now = 150.0
    assert app_clock.overdue(2.0) == []
    app_clock.resumed(token)
    clock.now = 152.5
    assert app_clock.overdue(2.0) == [token]


def test_extending_moves_this_requests_soft_and_hard_deadlines_only() -> None:
    app_clock, slots, clock = make()
    long = app_clock.started("GET", b"/export")
    clock.now = 101.0
    other = app_clock.started("GET", b"/other")
    assert app_clock.extend(long, 60.0)
    assert slots.deadline(0) == 131.0  # the other one holds it now
    assert app_clock.extension(long) == 60.0
    clock.now = 103.5
    assert app_clock.overdue(2.0) == [other]  # the extended one is not overdue
    app_clock.finished(other)
    assert slots.deadline(0) == 190.0  # 100 + 60 + 30: its own share of the hard deadline
    clock.now = 150.0
    app_clock.tick()
    assert slots.deadline(0) == 190.0  # a tick does not push a held (extended) deadline
    clock.now = 162.5
    assert app_clock.overdue(2.0) == [long]  # 100 + 60 + 2
    app_clock.finished(long)
    assert not app_clock.busy and app_clock.hung == 0 and app_clock.extension(long) == 0.0
    assert slots.deadline(0) == 192.5


def test_extensions_add_up() -> None:
    app_clock, slots, _clock = make()
    token = app_clock.started()
    app_clock.extend(token, 10.0)
    app_clock.extend(token, 5.0)
    assert app_clock.extension(token) == 15.0 and slots.deadline(0) == 145.0


def test_an_extended_request_that_waits_keeps_its_extension_when_it_resumes() -> None:
    app_clock, slots, clock = make()
    token = app_clock.started()
    app_clock.extend(token, 10.0)
    clock.now = 101.0
    app_clock.waiting(token)
    assert not app_clock.busy
    clock.now = 200.0
    app_clock.resumed(token)
    assert app_clock.busy and slots.deadline(0) == 240.0  # re-entered at 200, + 10 + 30
    clock.now = 211.0
    assert app_clock.overdue(10.0) == []
    clock.now = 220.5
    assert app_clock.overdue(10.0) == [token]


def test_extending_a_finished_request_does_nothing() -> None:
    app_clock, slots, clock = make()
    token = app_clock.started()
    app_clock.finished(token)
    assert not app_clock.extend(token, 10.0)
    assert slots.deadline(0) == 130.0 and app_clock.extension(token) == 0.0


def test_a_request_started_after_an_extended_one_is_never_given_a_late_deadline_past_a_tick() -> None:
    app_clock, slots, clock = make()
    long = app_clock.started()
    app_clock.extend(long, 100.0)
    clock.now = 110.0
    app_clock.started()  # started() alone sees nothing older in _in_app: the deadline is 140
    app_clock.tick()
    assert slots.deadline(0) == 140.0  # 110 + 30 comes before 100 + 100 + 30


def test_overdue_does_not_wait_for_a_held_lock() -> None:
    app_clock, _slots, clock = make()
    app_clock.started()
    clock.now = 200.0
    app_clock._lock.acquire()
    try:
        assert app_clock.overdue(2.0, blocking=False) is None  # a signal handler on the holder's thread
    finally:
        app_clock._lock.release()
    assert app_clock.overdue(2.0, blocking=False) is not None


def test_extend_deadline_outside_a_request_is_a_no_op_and_checks_its_argument() -> None:
    import math

    import pytest

    import refork
    from refork import deadlines

    assert refork.extend_deadline(5) is False  # no request here (a test, another server)
    app_clock, slots, _clock = make()
    token = app_clock.started()
    deadlines.install(app_clock.extend)
    try:
        assert refork.extend_deadline(5) is False  # still no current request in this context
        serving = deadlines.current.set(token)
        try:
            assert refork.extend_deadline(5) is True
            assert slots.deadline(0) == 135.0
            for bad in (-1, math.inf, math.nan):
                with pytest.raises(ValueError):
                    refork.extend_deadline(bad)
        finally:
            deadlines.current.reset(serving)
    finally:
        deadlines.install(None)


def test_an_event_loops_clock_watches_the_loop_not_its_awaiting_requests() -> None:
    slots, clock = Slots(1), Clock()
    app_clock = AppClock(slots, 0, 30.0, clock, heartbeat=True)
    hung = app_clock.started()  # an ASGI request awaiting something that never comes
    clock.now = 200.0
    app_clock.tick()  # the loop runs: it ticks
    assert slots.deadline(0) == 230.0 and app_clock.busy
    other = app_clock.started()
    clock.now = 210.0
    app_clock.finished(other)
    assert slots.deadline(0) == 240.0  # the hung request holds nothing
    clock.now = 300.0  # no tick since 210: the loop is blocked in the app, and the worker is late
    assert slots.deadline(0) < clock.now
    assert app_clock.overdue(60.0) == [hung]  # the soft deadline still sees the request itself


@pytest.mark.parametrize("record", [False, True], ids=["plain", "recording"])
@pytest.mark.parametrize("heartbeat", [False, True], ids=["threads", "loop"])
def test_the_native_writes_are_the_python_ones(
    record: bool, heartbeat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same requests through a clock of each kind: the same slot, word for word."""
    words = []
    for kind in (_native.SlotWords, None):
        monkeypatch.setattr(slots_module, "SlotWords", kind)
        slots, clock = Slots(2), Clock()
        app_clock = AppClock(slots, 1, 30.0, clock, heartbeat=heartbeat, record=record)
        tokens = []
        for i, status in enumerate([200, 404, 0, 503, 99, 600, 302, 200]):
            tokens.append(app_clock.started("GET", b"/"))
            clock.now += 0.001 * (i + 1) ** 2
            if i % 3 == 2:
                served = app_clock.finished(tokens.pop(0), status)
                assert served == app_clock.served
        while tokens:
            clock.now += 0.25
            app_clock.finished(tokens.pop(), 201)
        words.append(bytes(slots._map))
    assert words[0] == words[1]
