"""The worker's deadline counts time in the app only (AppClock), without processes or sockets."""

from __future__ import annotations

from refork.process.slots import AppClock, Slots


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
