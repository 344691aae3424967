"""HttpCycle without sockets: the connection's events go in, the state and the Channel calls come out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from refork.asgi import HIGH_WATER, ClientDisconnected, CycleState, HttpCycle
from refork.asgi.cycle import AppSteps
from refork.http.events import Request
from refork.http.response import CONTINUE


class Channel:
    """Records what the cycle tells its connection."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.taken = 0
        self.held: list[HttpCycle] = []
        self.done: list[bool] = []
        self.writable = True
        self.waits: list[bool] = []  # client_wait calls: True = the app waits on the client

    def write(self, data: bytes) -> bool:
        self.written.append(data)
        return self.writable

    def body_taken(self) -> None:
        self.taken += 1

    def hold_head(self, cycle: HttpCycle) -> None:
        self.held.append(cycle)

    def client_wait(self, cycle: HttpCycle, waiting: bool) -> None:
        self.waits.append(waiting)

    def cycle_done(self, cycle: HttpCycle, keep_alive: bool) -> None:
        self.done.append(keep_alive)


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def post(**kw: Any) -> Request:
    return Request("POST", b"/", b"/", b"", "1.1", [(b"host", b"a")], content_length=3, **kw)


def get() -> Request:
    return Request("GET", b"/", b"/", b"", "1.1", [(b"host", b"a")])


def request_message(body: bytes, more: bool) -> dict[str, Any]:
    return {"type": "http.request", "body": body, "more_body": more}


START = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
BODY = {"type": "http.response.body", "body": b"ok"}


def test_a_whole_exchange_walks_the_states(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    assert cycle.state is CycleState.RECEIVING_BODY
    assert not cycle.body_received(b"ab")
    assert loop.run_until_complete(cycle.receive()) == request_message(b"ab", more=True)
    cycle.body_received(b"c")
    cycle.end_received()
    assert cycle.state is CycleState.BODY_DONE
    assert loop.run_until_complete(cycle.receive()) == request_message(b"c", more=False)
    loop.run_until_complete(cycle.send(START))
    assert cycle.state is CycleState.RESPONSE_STARTED and channel.held == [cycle]
    loop.run_until_complete(cycle.send(BODY))
    assert cycle.state is CycleState.RESPONSE_DONE and channel.done == [True]
    assert channel.written[0].startswith(b"HTTP/1.1 200 OK\r\n") and channel.written[0].endswith(b"ok")
    assert loop.run_until_complete(cycle.receive()) == {"type": "http.disconnect"}


def test_a_response_may_start_before_the_body_is_in(loop) -> None:
    cycle = HttpCycle(Channel(), loop, post())
    loop.run_until_complete(cycle.send(START))
    assert cycle.state is CycleState.STREAMING
    cycle.body_received(b"abc")
    cycle.end_received()
    assert cycle.state is CycleState.RESPONSE_STARTED
    assert loop.run_until_complete(cycle.receive())["body"] == b"abc"


def test_a_client_gone_mid_body_is_a_disconnect_and_ends_the_cycle_once(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    cycle.body_received(b"a")
    cycle.client_gone()
    assert cycle.state is CycleState.DISCONNECTED
    assert loop.run_until_complete(cycle.receive()) == {"type": "http.disconnect"}  # no partial body

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)

    loop.run_until_complete(cycle.run(app, {}))
    assert channel.done == [False] and channel.written == []


def test_a_complete_body_is_still_delivered_after_the_client_left(loop) -> None:
    cycle = HttpCycle(Channel(), loop, post())
    cycle.body_received(b"abc")
    cycle.end_received()
    cycle.client_gone()
    assert loop.run_until_complete(cycle.receive())["body"] == b"abc"
    assert loop.run_until_complete(cycle.receive()) == {"type": "http.disconnect"}
    with pytest.raises(ClientDisconnected):
        loop.run_until_complete(cycle.send(START))


def test_a_body_backlog_asks_the_connection_to_stop_reading_until_taken(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    assert cycle.body_received(b"x" * HIGH_WATER + b"x") and cycle.backlogged
    loop.run_until_complete(cycle.receive())
    assert channel.taken == 1 and not cycle.backlogged


def test_100_continue_is_sent_once_when_the_app_waits_for_the_body(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post(expect_continue=True))
    task = loop.create_task(cycle.receive())
    loop.run_until_complete(asyncio.sleep(0))
    cycle.body_received(b"abc")
    cycle.end_received()
    loop.run_until_complete(task)
    assert channel.written == [CONTINUE]


def test_answering_without_the_go_ahead_closes_the_connection(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post(expect_continue=True))
    loop.run_until_complete(cycle.send(START))
    loop.run_until_complete(cycle.send(BODY))
    assert channel.done == [False] and b"Connection: close" in channel.written[0]


def test_send_waits_while_the_connection_cannot_write(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    cycle.end_received()
    loop.run_until_complete(cycle.send(START))
    channel.writable = False
    task = loop.create_task(cycle.send({"type": "http.response.body", "body": b"o", "more_body": True}))
    loop.run_until_complete(asyncio.sleep(0))
    assert not task.done()
    cycle.resume_sending()
    loop.run_until_complete(task)


def test_an_app_error_before_the_response_is_a_500_after_it_only_a_log(loop, caplog) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    cycle.end_received()

    async def fails(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    loop.run_until_complete(cycle.run(fails, {}))
    assert channel.written[0].startswith(b"HTTP/1.1 500") and channel.done == [False]

    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    cycle.end_received()

    async def fails_late(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await send(BODY)
        raise RuntimeError("late")

    loop.run_until_complete(cycle.run(fails_late, {}))
    assert channel.done == [True]
    assert "after the response was sent" in caplog.text


def test_waiting_for_body_bytes_or_write_room_is_the_clients_time_not_the_apps(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    receiving = loop.create_task(cycle.receive())
    loop.run_until_complete(asyncio.sleep(0))
    assert channel.waits == [True]  # awaiting body bytes
    cycle.body_received(b"abc")
    cycle.end_received()
    loop.run_until_complete(receiving)
    assert channel.waits == [True, False]
    channel.writable = False
    sending = loop.create_task(cycle.send(START))
    loop.run_until_complete(asyncio.sleep(0))
    body = loop.create_task(cycle.send({"type": "http.response.body", "body": b"o", "more_body": True}))
    loop.run_until_complete(asyncio.sleep(0))
    assert channel.waits == [True, False, True]  # backpressure
    cycle.resume_sending()
    loop.run_until_complete(asyncio.gather(sending, body))
    assert channel.waits == [True, False, True, False]


def test_waiting_for_a_disconnect_after_the_body_is_the_apps_time(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, post())
    cycle.body_received(b"abc")
    cycle.end_received()
    loop.run_until_complete(cycle.receive())
    listener = loop.create_task(cycle.receive())  # e.g. a framework's disconnect watcher
    loop.run_until_complete(asyncio.sleep(0))
    assert channel.waits == []
    cycle.client_gone()
    assert loop.run_until_complete(listener) == {"type": "http.disconnect"}


def run_app(loop: asyncio.AbstractEventLoop, cycle: HttpCycle, app: Any) -> None:
    cycle.task = loop.create_task(cycle.run(app, {}))
    loop.run_until_complete(cycle.task)


@pytest.mark.skipif(AppSteps is None, reason="refork._native not built: every start holds its head")
def test_a_response_in_one_step_leaves_no_head_to_flush(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, get())

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await send(BODY)

    run_app(loop, cycle, app)
    assert channel.held == [] and channel.done == [True]
    assert channel.written[0].startswith(b"HTTP/1.1 200 OK\r\n") and channel.written[0].endswith(b"ok")


def test_a_head_still_held_when_its_step_ends_is_flushed_after_it(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, get())
    seen: list[list[HttpCycle]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(START)
        await asyncio.sleep(0)  # the step ends with the head held
        seen.append(list(channel.held))
        await send(BODY)

    run_app(loop, cycle, app)
    assert seen == [[cycle]] and channel.held == [cycle] and channel.done == [True]


def test_a_head_started_from_another_task_is_held_at_once(loop) -> None:
    channel = Channel()
    cycle = HttpCycle(channel, loop, get())
    seen: list[list[HttpCycle]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        async def respond() -> None:
            await send(START)
            seen.append(list(channel.held))
            await asyncio.sleep(0)
            await send(BODY)

        await asyncio.create_task(respond())

    run_app(loop, cycle, app)
    assert seen[0] == [cycle] and channel.done == [True]
