"""WebSockets without sockets: the parser's hand-off after a handshake, the websocket scope, the
session state machine (accept, messages, close, denial, errors, backpressure) and the app clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from refork.asgi.cycle import ClientDisconnected
from refork.asgi.websocket import WebSocketSession, WebSocketState, build_websocket_scope
from refork.http.events import EndOfMessage, Request
from refork.http.parser import RequestParser
from refork.process.slots import AppClock, Slots

HANDSHAKE = (
    b"GET /ws?x=1 HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: chat, superchat\r\n\r\n"
)


# -- the parser's hand-off (sans-IO) ------------------------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
def test_parser_hands_over_after_a_websocket_handshake(split):
    parser = RequestParser(hand_off_websocket=True)
    stream = b"GET /a HTTP/1.1\r\nHost: a\r\n\r\n" + HANDSHAKE + b"\x81\x85frame"
    events: list[Any] = []
    if split:
        for i in range(len(stream)):
            events += parser.feed(stream[i : i + 1])
            if parser.upgraded is not None:
                rest = stream[i + 1 :]
                break
    else:
        events = parser.feed(stream)
        rest = b""
    kinds = [type(e) for e in events]
    assert kinds == [Request, EndOfMessage, Request, EndOfMessage]
    assert not events[0].websocket and events[2].websocket
    assert events[2].path == b"/ws" and events[2].query == b"x=1"
    assert parser.upgraded + rest == b"\x81\x85frame"
    assert parser.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n") == []  # done with HTTP


def test_parser_without_hand_off_keeps_parsing_http():
    parser = RequestParser()
    events = parser.feed(HANDSHAKE + b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
    assert [type(e) for e in events] == [Request, EndOfMessage, Request, EndOfMessage]
    assert events[0].websocket and events[2].path == b"/next"
    assert parser.upgraded is None


@pytest.mark.parametrize(
    "head",
    [
        b"POST /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
        b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",  # no Connection: upgrade
        b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Content-Length: 2\r\n\r\nab",
    ],
    ids=["post", "h2c", "no-connection", "with-body"],
)
def test_other_upgrades_stay_http(head):
    parser = RequestParser(hand_off_websocket=True)
    events = parser.feed(head + b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
    requests = [e for e in events if type(e) is Request]
    assert len(requests) == 2 and not requests[0].websocket and requests[1].path == b"/next"
    assert parser.upgraded is None


# -- the scope and the session (sans-IO) --------------------------------------------------------


def _request() -> Request:
    return RequestParser().feed(HANDSHAKE)[0]  # type: ignore[return-value]


def test_websocket_scope():
    scope = build_websocket_scope(
        _request(), server=("127.0.0.1", 8000), client=("10.0.0.1", 5555), scheme="https", root_path="/api",
        state={"db": 1},
    )  # fmt: skip
    assert scope["type"] == "websocket" and "method" not in scope
    assert scope["asgi"]["spec_version"] >= "2.4"
    assert scope["scheme"] == "wss"
    assert scope["subprotocols"] == ["chat", "superchat"]
    assert scope["path"] == "/api/ws" and scope["root_path"] == "/api" and scope["query_string"] == b"x=1"
    assert scope["extensions"] == {"websocket.http.response": {}}
    assert scope["state"] == {"db": 1}
    assert scope["client"] == ("10.0.0.1", 5555) and scope["server"] == ("127.0.0.1", 8000)


class Channel:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.writable = True

    def accept(self, subprotocol, headers):
        self.calls.append(("accept", subprotocol, headers))

    def respond(self, data, done):
        self.calls.append(("respond", data, done))

    def send_message(self, data):
        self.calls.append(("send", data))
        return self.writable

    def close(self, code, reason):
        self.calls.append(("close", code, reason))

    def message_taken(self, queued, size):
        self.calls.append(("taken", queued, size))


def run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


def session() -> tuple[WebSocketSession, Channel]:
    channel = Channel()
    loop = asyncio.new_event_loop()
    return WebSocketSession(channel, loop, _request()), channel


def test_session_accept_messages_close():
    s, ch = session()

    async def go():
        assert await s.receive() == {"type": "websocket.connect"}
        await s.send({"type": "websocket.accept", "subprotocol": "chat", "headers": [(b"x-a", b"1")]})
        s.message_received("hi")
        s.message_received(b"\x00")
        assert await s.receive() == {"type": "websocket.receive", "text": "hi"}
        assert await s.receive() == {"type": "websocket.receive", "bytes": b"\x00"}
        await s.send({"type": "websocket.send", "text": "yo"})
        await s.send({"type": "websocket.send", "bytes": b"b", "text": None})
        await s.send({"type": "websocket.close", "code": 4000, "reason": "bye"})
        s.disconnected(4000, "bye")
        assert await s.receive() == {"type": "websocket.disconnect", "code": 4000, "reason": "bye"}

    s.loop.run_until_complete(go())
    assert ch.calls == [
        ("accept", "chat", [(b"x-a", b"1")]),
        ("taken", 1, 2),
        ("taken", 0, 1),
        ("send", "yo"),
        ("send", b"b"),
        ("close", 4000, "bye"),
    ]
    assert s.status == 101 and s.sent == 3 and s.received == 3


@pytest.mark.parametrize(
    "messages,error",
    [
        ([{"type": "websocket.send", "text": "x"}], "Expected ASGI message 'websocket.accept'"),
        ([{"type": "http.response.start"}], "Expected ASGI message 'websocket.accept'"),
        ([{"nope": 1}], "must be a dict with a 'type' key"),
        ([{"type": "websocket.accept", "subprotocol": 3}], "'subprotocol' must be a str"),
        ([{"type": "websocket.accept", "headers": [("a", "b")]}], "must be bytes"),
        ([{"type": "websocket.accept", "headers": [(b"sec-websocket-accept", b"x")]}], "set by the server"),
        ([{"type": "websocket.accept"}, {"type": "websocket.send"}], "exactly one of 'bytes' and 'text'"),
        (
            [{"type": "websocket.accept"}, {"type": "websocket.send", "text": "a", "bytes": b"b"}],
            "exactly one",
        ),
        ([{"type": "websocket.accept"}, {"type": "websocket.send", "text": b"a"}], "'text' must be a str"),
        (
            [{"type": "websocket.accept"}, {"type": "websocket.accept"}],
            "Expected ASGI message 'websocket.send'",
        ),
        (
            [{"type": "websocket.accept"}, {"type": "websocket.close", "code": 1005}],
            "Invalid WebSocket close code",
        ),
        (
            [{"type": "websocket.accept"}, {"type": "websocket.close", "reason": "x" * 124}],
            "at most 123 bytes",
        ),
        (
            [
                {"type": "websocket.accept"},
                {"type": "websocket.close"},
                {"type": "websocket.send", "text": "a"},
            ],
            "after sending 'websocket.close'",
        ),  # fmt: skip
        (
            [
                {"type": "websocket.http.response.start", "status": 401},
                {"type": "websocket.send", "text": "a"},
            ],
            "Expected ASGI message 'websocket.http.response.body'",
        ),  # fmt: skip
    ],
)
def test_session_refuses_invalid_messages(messages, error):
    s, _ = session()

    async def go():
        await s.receive()
        for message in messages:
            await s.send(message)

    with pytest.raises(RuntimeError, match=error):
        s.loop.run_until_complete(go())


def test_session_close_before_accept_is_403_and_return_too():
    s, ch = session()
    s.loop.run_until_complete(s.send({"type": "websocket.close"}))
    assert s.status == 403 and ch.calls[0][0] == "respond" and ch.calls[0][1].startswith(b"HTTP/1.1 403 ")
    s2, ch2 = session()

    async def returns(scope, receive, send):
        await receive()

    s2.loop.run_until_complete(s2.run(returns, {}))
    assert s2.status == 403 and ch2.calls[0][1].startswith(b"HTTP/1.1 403 ")


def test_session_raise_before_accept_is_500_after_accept_1011(caplog):
    async def raises(scope, receive, send):
        await receive()
        raise ValueError("boom")

    s, ch = session()
    s.loop.run_until_complete(s.run(raises, {}))
    assert s.status == 500 and ch.calls[0][1].startswith(b"HTTP/1.1 500 ")

    async def accepts_then_raises(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        raise ValueError("boom")

    s, ch = session()
    s.loop.run_until_complete(s.run(accepts_then_raises, {}))
    assert ch.calls[-1] == ("close", 1011, "")
    assert "Exception in ASGI application" in caplog.text


def test_session_denial_response():
    s, ch = session()

    async def go():
        await s.send({"type": "websocket.http.response.start", "status": 401, "headers": [(b"x", b"y")]})
        await s.send({"type": "websocket.http.response.body", "body": b"no", "more_body": True})
        await s.send({"type": "websocket.http.response.body", "body": b"pe"})

    s.loop.run_until_complete(go())
    wire = b"".join(call[1] for call in ch.calls)
    assert wire.startswith(b"HTTP/1.1 401 ") and b"x: y\r\n" in wire and b"Connection: close" in wire
    assert ch.calls[-1][2] is True and s.state is WebSocketState.CLOSED and s.status == 401


def test_session_after_disconnect():
    s, _ = session()

    async def go():
        await s.receive()
        await s.send({"type": "websocket.accept"})
        s.message_received("last words")
        s.disconnected(1006)
        assert (await s.receive())["text"] == "last words"  # what arrived first, first
        assert await s.receive() == {"type": "websocket.disconnect", "code": 1006, "reason": ""}
        await s.send({"type": "websocket.close"})  # a no-op
        with pytest.raises(ClientDisconnected):
            await s.send({"type": "websocket.send", "text": "x"})

    s.loop.run_until_complete(go())


def test_session_send_waits_while_not_writable():
    s, ch = session()
    ch.writable = False

    async def go():
        await s.receive()
        await s.send({"type": "websocket.accept"})
        sending = asyncio.ensure_future(s.send({"type": "websocket.send", "bytes": b"x"}))
        await asyncio.sleep(0.01)
        assert not sending.done()
        s.resume_sending()
        await sending

    s.loop.run_until_complete(go())


def test_app_clock_counts_websockets_without_holding_the_deadline():
    slots = Slots(1)
    now = [100.0]
    clock = AppClock(slots, 0, 30.0, lambda: now[0])
    token = clock.started("GET", b"/ws")
    assert slots.deadline(0) == 130.0  # the connect handler is in the app
    clock.upgraded(token)
    assert slots.websockets(0) == 1 and not clock.busy
    now[0] = 4000.0
    clock.tick()
    assert slots.deadline(0) == 4030.0  # an hour-long WebSocket holds no deadline
    counters = slots.counters(0)
    assert counters.in_flight == 1 and counters.websockets == 1
    clock.finished(token, 101)
    assert slots.websockets(0) == 0 and slots.counters(0).statuses[0] == 1
