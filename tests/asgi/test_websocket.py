"""WebSockets for ASGI apps: the parser's hand-off, the session state machine (no sockets), then real
servers (the CLI) with the `websockets` client and raw sockets: handshake, echo, subprotocols,
denial, 403, close codes, limits, pings, backpressure, stop (1001) and reload (1012), WSGI (400),
--ws none, status, metrics and the access log.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import struct
import time
import urllib.request
from typing import Any

import pytest
from conftest import free_port, pids_alive, run_cli
from support.waits import sender_blocked, wait_until
from support.websocket import BINARY, CLOSE, PING, PONG, TEXT, RawWebSocket
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from refork.asgi.cycle import ClientDisconnected
from refork.asgi.websocket import WebSocketSession, WebSocketState, build_websocket_scope
from refork.http.events import EndOfMessage, Request
from refork.http.parser import RequestParser
from refork.memory.accounting import read_memory
from refork.process.slots import AppClock, Slots

APP = "apps.ws_apps:app"
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


# -- real servers --------------------------------------------------------------------------------


def url(server, path: str = "/echo") -> str:
    return f"ws://127.0.0.1:{server.port}{path}"


def test_echo_subprotocol_headers_and_scope(start_server):
    server = start_server(app=APP, workers=1)
    with connect(url(server), ping_interval=None) as ws:
        ws.send("hello")
        assert ws.recv() == "hello"
        ws.send(b"\x00\xff")
        assert ws.recv() == b"\x00\xff"
        assert "permessage-deflate" in ws.response.headers["Sec-WebSocket-Extensions"]
    with connect(url(server, "/proto"), subprotocols=["chat", "other"], ping_interval=None) as ws:
        assert ws.subprotocol == "chat" and ws.response.headers["x-extra"] == "yes"
    with connect(url(server, "/scope?q=1"), ping_interval=None, subprotocols=["a", "b"]) as ws:
        scope = json.loads(ws.recv())
    assert scope["type"] == "websocket" and scope["scheme"] == "ws" and scope["path"] == "/scope"
    assert scope["subprotocols"] == ["a", "b"] and scope["extensions"] == ["websocket.http.response"]
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.4"} and scope["http_version"] == "1.1"
    assert scope["has_state"] and scope["client"][0] == "127.0.0.1"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("tls", [False, True], ids=["ws", "wss"])
def test_loops_and_tls(start_server, tmp_path, loop, tls):
    """The hand-over (transport.set_protocol) on both loops, plain and over TLS.

    The client is websockets' asyncio one: the sync client reads its socket on a thread of its own
    while the caller writes, and over TLS 1.3 the server's session tickets reach that thread as the
    handshake request goes out; one OpenSSL connection used by two threads at once fails now and
    then (an SSL error or a read of b"" on the client: "did not receive a valid HTTP response")."""
    args = ["--loop", loop]
    ssl_context = None
    if tls:
        from support.certs import Certs

        certs = Certs(tmp_path)
        args += certs.args()
        ssl_context = certs.client_context()
    server = start_server(*args, app=APP, workers=1)
    scheme = "wss" if tls else "ws"
    shown, echoed = asyncio.run(scope_and_echo(f"{scheme}://127.0.0.1:{server.port}", ssl_context))
    assert shown["scheme"] == scheme
    assert ("tls" in shown["extensions"]) == tls  # the ASGI TLS extension (tests/serving/test_tls.py)
    assert echoed == [b"z" * size for size in ECHO_SIZES]


ECHO_SIZES = (10, 100_000, 3_000_000)


async def scope_and_echo(base: str, ssl_context: Any) -> tuple[dict[str, Any], list[Any]]:
    """/scope's scope, then what /echo sent back for each of ECHO_SIZES, over one connection each."""
    async with async_connect(f"{base}/scope", ssl=ssl_context, ping_interval=None) as ws:
        shown = json.loads(await ws.recv())
    echoed = []
    async with async_connect(f"{base}/echo", ssl=ssl_context, ping_interval=None, max_size=None) as ws:
        for size in ECHO_SIZES:
            await ws.send(b"z" * size)
            echoed.append(await ws.recv())
    return shown, echoed


def test_no_per_message_deflate(start_server):
    server = start_server("--no-ws-per-message-deflate", app=APP, workers=1)
    with connect(url(server), ping_interval=None) as ws:
        assert "Sec-WebSocket-Extensions" not in ws.response.headers
        ws.send("x" * 10000)
        assert ws.recv() == "x" * 10000


@pytest.mark.parametrize(
    "path,status,body",
    [
        ("/refuse", 403, b"Forbidden\n"),
        ("/return", 403, b"Forbidden\n"),
        ("/raise", 500, None),
        ("/deny", 401, b"no token"),
    ],  # fmt: skip
)
def test_refusals(start_server, path, status, body):
    server = start_server("--access-logfile", "-", app=APP, workers=1)
    with pytest.raises(InvalidStatus) as info, connect(url(server, path), ping_interval=None):
        pass
    response = info.value.response
    assert response.status_code == status
    if body is not None:
        assert response.body == body
    if path == "/deny":
        assert response.headers["www-authenticate"] == "Bearer"
    server.wait_for(lambda: f'"GET {path} HTTP/1.1" {status}' in server.log(), what="the access-log line")


def test_close_codes_both_ways_and_access_log(start_server, tmp_path):
    app_log = tmp_path / "app.log"
    server = start_server("--access-logfile", "-", app=APP, workers=1, env={"WS_APP_LOG": str(app_log)})
    with (
        connect(url(server, "/close?code=4001&reason=bye"), ping_interval=None) as ws,
        pytest.raises(ConnectionClosed) as info,
    ):
        ws.recv()
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (4001, "bye")
    with connect(url(server, "/echo"), ping_interval=None) as ws:
        ws.close(4400, "client says bye")
    server.wait_for(
        lambda: app_log.exists() and "/echo 4400 client says bye" in app_log.read_text(), what="app"
    )
    server.wait_for(
        lambda: '"GET /echo HTTP/1.1" 101' in server.log(), what="the access-log line of a WebSocket"
    )
    # an app that sends after closing gets a clear RuntimeError
    with connect(url(server, "/after-close"), ping_interval=None) as ws, pytest.raises(ConnectionClosed):
        ws.recv()
    server.wait_for(lambda: "after sending 'websocket.close'" in server.log(), what="the RuntimeError")


def test_max_size_closes_1009(start_server):
    server = start_server("--ws-max-size", "1K", app=APP, workers=1)
    with connect(url(server), ping_interval=None, compression=None) as ws:
        ws.send("x" * 1024)
        assert ws.recv() == "x" * 1024
        ws.send("x" * 1025)
        with pytest.raises(ConnectionClosed) as info:
            ws.recv()
        assert info.value.rcvd.code == 1009
    with connect(url(server), ping_interval=None) as ws:  # compressed: judged after decompression
        ws.send(b"\x00" * 100_000)
        with pytest.raises(ConnectionClosed) as info:
            ws.recv()
        assert info.value.rcvd.code == 1009
    with connect(url(server), ping_interval=None) as ws:  # text: its UTF-8 bytes count, not characters
        ws.send(["é" * 300, "é" * 212])  # fragments, each under the limit
        assert ws.recv() == "é" * 512
        with pytest.raises(ConnectionClosed) as info:  # the client ends a list with an empty frame:
            ws.send(["é" * 300, "é" * 213])  # the close can reach it before that one is sent
            ws.recv()
        assert info.value.rcvd.code == 1009


def test_write_timeout_cuts_a_client_that_reads_nothing(start_server):
    server = start_server("--write-timeout", "1", app=APP, workers=1)
    reader = RawWebSocket(server.port, "/flood?size=65536")
    assert reader.accepted()
    server.wait_for(lambda: "write timeout:" in server.log() and "GET /flood" in server.log(), what="the cut")
    server.wait_for(lambda: server.workers()[0]["websockets"] == 0, what="the WebSocket to be gone")
    reader.close()


def test_max_queue_pauses_reading(start_server):
    """--ws-max-queue: an app that does not receive stops the server reading (the client's sends
    block on TCP), not a queue in the worker that grows with what the client sends."""
    server = start_server("--ws-max-queue", "2", app=APP, workers=1)
    ws = RawWebSocket(server.port, "/sleepy?sleep=2&expect=64")
    assert ws.accepted()
    ws.sock.settimeout(1.0)
    piece = b"q" * (512 << 10)
    with pytest.raises(TimeoutError):
        for _ in range(64):  # 32 MB: more than the loopback socket buffers hold
            ws.send_frame(BINARY, piece)
    ws.sock.settimeout(30)
    ws.sock.setblocking(True)
    ws.close()


def test_deflate_bomb_closes_1009_without_inflating_it(start_server):
    server = start_server(app=APP, workers=1)  # --ws-max-size 16M
    worker = server.workers()[0]["pid"]
    before = read_memory(worker).rss  # read now (the status caches its samples for a second)
    with connect(url(server), ping_interval=None, max_size=None) as ws:
        ws.send(b"\x00" * (64 << 20))  # 64 MB of zeros: about 64 KB on the wire
        with pytest.raises(ConnectionClosed) as info:
            ws.recv()
        assert info.value.rcvd.code == 1009
    after = read_memory(worker).rss
    assert after - before < 32 << 20  # the 64 MB were never inflated


def test_pings_keep_alive_and_a_silent_peer_is_closed_1011(start_server):
    server = start_server("--ws-ping-interval", "1", "--ws-ping-timeout", "1", app=APP, workers=1)
    with connect(url(server), ping_interval=None) as ws:  # the library answers pings itself
        time.sleep(3.5)  # (the input, not a wait) a quiet client across three pings and their timeouts
        ws.send("still open")
        assert ws.recv() == "still open"
    silent = RawWebSocket(server.port, "/echo")
    assert silent.accepted()
    fin, opcode, payload, _ = silent.recv_frame()
    assert opcode == PING  # ... and never answered
    code, reason = silent.expect_close(timeout=10)
    assert code == 1011 and reason == b"keepalive ping timeout"
    silent.expect_eof()
    silent.close()
    answering = RawWebSocket(server.port, "/echo")
    for _ in range(2):
        fin, opcode, payload, _ = answering.recv_frame()
        assert opcode == PING
        answering.send_frame(PONG, payload)
    answering.send_frame(TEXT, b"alive")
    assert answering.recv_message() == (TEXT, b"alive")
    answering.close()


def test_backpressure_send_waits_for_a_slow_reader(start_server):
    server = start_server("--ws-write-limit", "64K", app=APP, workers=1)
    reader = RawWebSocket(server.port, "/flood?size=16384")  # never reads: its buffers fill up
    assert reader.accepted()

    def sent() -> int:
        with connect(url(server, "/count"), ping_interval=None) as ws:
            return int(ws.recv())

    server.wait_for(lambda: sent() > 0, what="the flood to start")
    wait_until(lambda: sender_blocked(reader.sock), what="the reader's socket full")
    counts = [sent()]

    def settled() -> bool:
        counts.append(sent())
        return counts[-1] == counts[-2]

    wait_until(settled, what="the app's send() to wait")
    first = counts[-1]
    time.sleep(1.0)  # (the input, not a wait) a second more of a reader that does not read
    assert sent() == first  # the app's send() waits: nothing more is queued in the server
    assert first * 16384 < 32 << 20  # bounded by the socket buffers plus --ws-write-limit, not memory
    reader.close()


def open_client(server):
    """A sync `websockets` client kept open across statements: entered as its context manager
    (websockets 17 warns otherwise and offers legacy=True, which 16, the last for 3.10, lacks)."""
    return connect(url(server), ping_interval=None).__enter__()


def test_stop_closes_1001_and_the_app_sees_it(start_server, tmp_path):
    app_log = tmp_path / "app.log"
    server = start_server("--graceful-timeout", "10", app=APP, workers=1, env={"WS_APP_LOG": str(app_log)})
    clients = [open_client(server) for _ in range(3)]
    for ws in clients:
        ws.send("x")
        assert ws.recv() == "x"
    began = time.monotonic()
    server.signal(signal.SIGTERM)
    for ws in clients:
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=10)
        assert info.value.rcvd.code == 1001 and info.value.rcvd.reason == "server shutting down"
        ws.close()
    assert server.wait_exit(15) == 0
    assert time.monotonic() - began < 10  # the close handshake ended the drain, not the timeout
    assert app_log.read_text().count("/echo 1001 server shutting down") == 3


def test_an_app_ignoring_the_disconnect_does_not_hang_the_stop(start_server, tmp_path):
    server = start_server("--graceful-timeout", "3", app=APP, workers=1)
    ws = RawWebSocket(server.port, "/linger")
    assert ws.accepted()
    pid = server.workers()[0]["pid"]
    began = time.monotonic()
    server.signal(signal.SIGTERM)
    assert ws.expect_close()[0] == 1001
    ws.send_frame(CLOSE, struct.pack("!H", 1001))
    assert server.wait_exit(20) == 0
    assert time.monotonic() - began < 15  # within --graceful-timeout (plus the monitor's own steps)
    assert not pids_alive([pid])
    ws.close()


def test_reload_closes_1012_on_the_retiring_worker(start_server):
    server = start_server(app=APP, workers=1)
    with connect(url(server, "/pid"), ping_interval=None) as ws:
        old = int(ws.recv())
        server.signal(signal.SIGHUP)
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=30)
        assert info.value.rcvd.code == 1012 and info.value.rcvd.reason == "service restart"
    server.wait_for(lambda: not pids_alive([old]), what="the old worker's exit")
    with connect(url(server, "/pid"), ping_interval=None) as ws:  # the new generation serves
        assert int(ws.recv()) != old


def test_refork_with_an_open_websocket_promotes_the_worker_holding_it(start_server):
    """An open WebSocket does not hold a safe point: its worker is promoted (a fork) while the
    WebSocket stays open in the parent, which the rollout then retires, serving it on
    (tests/asgi/test_websocket_drain.py)."""
    server = start_server(app=APP, workers=1)
    with connect(url(server, "/pid"), ping_interval=None) as ws:
        old = int(ws.recv())
        ws.send("before")
        assert ws.recv() == "before"
        assert server.request("refork")["ok"] is True
        server.wait_for(lambda: [w["generation"] for w in server.workers()] == [1], what="the rollout")
        ws.send("after")
        assert ws.recv(timeout=10) == "after"
    assert f"promoting worker 0 (pid {old}" in server.log()  # the worker holding the WebSocket
    assert "Traceback" not in server.log()
    with connect(url(server, "/pid"), ping_interval=None) as ws:
        assert int(ws.recv()) != old


def test_status_metrics_count_open_websockets(start_server):
    mport = free_port()
    server = start_server("--metrics-bind", f"127.0.0.1:{mport}", app=APP, workers=1)
    clients = [open_client(server) for _ in range(2)]
    try:
        server.wait_for(lambda: server.workers()[0]["websockets"] == 2, what="2 open in status")
        text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
        assert "refork_websockets 2" in text
        assert any(
            line.startswith("refork_worker_websockets{") and line.endswith(" 2") for line in text.splitlines()
        )
        table = run_cli("status", "--control-socket", server.control).stdout
        header = next(line for line in table.splitlines() if line.startswith("PID"))
        assert "WS" in header and "websockets 2" not in table  # a column, not a line
    finally:
        for ws in clients:
            ws.close()
    server.wait_for(lambda: server.workers()[0]["websockets"] == 0, what="0 open after the closes")


def test_ws_none_serves_the_handshake_as_http(start_server):
    server = start_server("--ws", "none", app=APP, workers=1)
    ws = RawWebSocket(server.port, "/echo")
    assert ws.status == 200
    assert b"http /echo upgrade=websocket" in ws.body()
    ws.close()


def test_wsgi_app_answers_400_and_never_sees_it(start_server):
    server = start_server("--access-logfile", "-", workers=1)  # apps.procs:app, WSGI
    before = server.workers()[0]["requests"]
    ws = RawWebSocket(server.port, "/echo")
    assert ws.status == 400 and ws.headers["connection"] == "close"
    assert ws.body().endswith(
        b"WebSocket upgrade refused: this server runs a WSGI app, which cannot accept WebSockets\n"
    )
    ws.close()
    assert server.workers()[0]["requests"] == before  # the app never ran
    status, _ = server.get("/")
    assert status == 200
    server.wait_for(lambda: '"GET /echo HTTP/1.1" 400' in server.log(), what="the access-log line")


def test_wsgi_with_threads_answers_400(start_server):
    server = start_server("--threads", "4", workers=1)
    ws = RawWebSocket(server.port, "/echo")
    assert ws.status == 400
    ws.close()


def test_a_pipelined_upgrade_is_refused_in_order(start_server):
    server = start_server(app=APP, workers=1)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    sock.sendall(
        b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        + f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 400 " in data  # pipelined: refused, in order
    sock.close()
