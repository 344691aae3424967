"""The ASGI http cycle without a server: the response state machine's messages, send_file on a
real socket in-process, the cycle reviewed against the spec and uvicorn, early hints. The same
extensions end to end, over real connections: test_asgi_extensions.py.
"""

from __future__ import annotations

import os
import socket
import time

import pytest

from refork.asgi import ResponseState
from refork.http.events import Request
from refork.http.response import simple_response

# ---------------------------------------------------------------------------------------------
# Units: the response state machine's new messages, and send_file on a real socket in-process


def _state(method: str = "GET", te: bytes | None = None, version: str = "1.1") -> ResponseState:
    headers = [(b"host", b"a")] + ([(b"te", te)] if te is not None else [])
    return ResponseState(Request(method, b"/", b"/", b"", version, headers))


def test_response_state_message_order_errors():
    state = _state(te=b"trailers")
    state.feed({"type": "http.response.start", "status": 200, "trailers": True})
    with pytest.raises(RuntimeError, match="before the last"):
        state.feed({"type": "http.response.trailers", "headers": []})
    state.feed({"type": "http.response.body", "body": b"x"})
    assert not state.complete and state.body_ended
    with pytest.raises(RuntimeError, match="Expected ASGI message 'http.response.trailers'"):
        state.feed({"type": "http.response.body", "body": b"y"})
    with pytest.raises(RuntimeError, match="Invalid trailer field"):
        state.feed({"type": "http.response.trailers", "headers": [(b"bad name", b"v")]})
    last = state.feed({"type": "http.response.trailers", "headers": [(b"x-a", b"1")]})
    assert last == b"0\r\nx-a: 1\r\n\r\n"
    assert state.complete
    with pytest.raises(RuntimeError, match="after the response completed"):
        state.feed({"type": "http.response.body", "body": b""})

    state = _state()
    state.feed({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    with pytest.raises(RuntimeError, match="longer than Content-Length"):
        state.file_frame("http.response.zerocopysend", 6, False)
    assert state.held_head is not None  # nothing left: the error can still become a 500
    before, after, send = state.file_frame("http.response.pathsend", 5, True)
    assert before.startswith(b"HTTP/1.1 200 OK\r\n") and after == b"" and send and state.complete
    with pytest.raises(RuntimeError):
        state.feed({"type": "http.response.body", "body": b""})

    head = _state("HEAD")
    head.feed({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    assert head.file_frame("http.response.pathsend", 5, False)[2] is False  # HEAD: no bytes


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_send_file_uses_sendfile_and_keeps_order(loop_name, tmp_path, monkeypatch):
    """A real transport on a socketpair; the reader is slow, so the kernel's buffer fills up."""
    import asyncio

    import uvloop

    from refork.serving.asgi import sendfile as aio_sendfile

    calls = []
    real_sendfile = os.sendfile

    def counting(*args):
        n = real_sendfile(*args)
        calls.append(n)
        return n

    monkeypatch.setattr(aio_sendfile.os, "sendfile", counting)
    data = os.urandom(3 * 1024 * 1024)
    path = tmp_path / "f"
    path.write_bytes(data)
    loop = uvloop.new_event_loop() if loop_name == "uvloop" else asyncio.new_event_loop()
    ours, theirs = socket.socketpair()
    theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)

    class Conn(asyncio.Protocol):
        closing = False
        write_blocked_since = 0.0
        waiter: asyncio.Future | None = None

        def connection_made(self, transport):
            self.transport = transport

        def pause_writing(self):
            self.write_blocked_since = 1.0

        def resume_writing(self):
            self.write_blocked_since = 0.0
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(None)

        async def wait_writable(self):
            self.waiter = loop.create_future()
            await self.waiter

    received = bytearray()

    def reader():
        while len(received) < len(data) + 10:
            time.sleep(0.001)  # (the input, not a wait) a slow reader: the sender blocks and resumes
            chunk = theirs.recv(65536)
            if not chunk:
                break
            received.extend(chunk)

    async def main():
        transport, conn = await loop.create_connection(Conn, sock=ours)
        transport.write(b"head")
        limits = transport.get_write_buffer_limits()
        with open(path, "rb") as f:
            sent = await aio_sendfile.send_file(conn, f.fileno(), 0, len(data))
        transport.write(b"tail!!")
        assert sent == len(data)
        assert transport.get_write_buffer_limits() == limits  # restored
        while transport.get_write_buffer_size():
            await asyncio.sleep(0.01)
        transport.close()

    import threading

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        loop.run_until_complete(main())
    finally:
        thread.join(10)
        loop.close()
        theirs.close()
    assert bytes(received) == b"head" + data + b"tail!!"
    assert sum(n for n in calls if n > 0) > len(data) // 2  # mostly zero-copy


# ---------------------------------------------------------------------------------------------
# Review of the http cycle against the spec and uvicorn


def _run_cycle(app, request: Request | None = None):
    import asyncio

    from test_asgi_cycle import Channel

    from refork.asgi import HttpCycle, build_scope

    loop = asyncio.new_event_loop()
    try:
        channel = Channel()
        request = request or Request("GET", b"/", b"/", b"", "1.1", [(b"host", b"a")])
        cycle = HttpCycle(channel, loop, request)
        cycle.end_received()
        scope = build_scope(request, server=None, client=None, state={})
        loop.run_until_complete(cycle.run(app, scope))
        return channel, cycle, scope
    finally:
        loop.close()


def test_cycle_review_gaps(caplog):
    async def returns_value(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})
        return 42

    channel, cycle, scope = _run_cycle(returns_value)
    assert channel.done == [True] and "should return None, but returned 42" in caplog.text
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.4"}
    assert set(scope["extensions"]) == {"http.response.pathsend", "http.response.zerocopysend",
                                        "http.response.trailers", "http.response.early_hint"}  # fmt: skip

    async def short(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
        await send({"type": "http.response.body", "body": b"ok"})

    caplog.clear()
    channel, cycle, scope = _run_cycle(short)
    assert channel.done == [False] and "8 bytes less than its Content-Length" in caplog.text

    async def after_end(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"ok"})
        try:
            await send({"type": "http.response.body", "body": b"more"})
        except RuntimeError as exc:
            scope["error"] = str(exc)
        assert (await receive())["type"] == "http.disconnect"  # the response is done

    channel, cycle, scope = _run_cycle(after_end)
    assert "after the response completed" in scope["error"] and channel.done == [True]

    async def start_then_fail(scope, receive, send):
        await send({"type": "http.response.start", "status": 200})
        raise ValueError("boom")

    channel, cycle, scope = _run_cycle(start_then_fail)
    assert channel.written[0].startswith(b"HTTP/1.1 500 ")  # the held head was dropped
    assert channel.done == [False]

    from refork.asgi import build_scope

    request = Request("GET", b"/", b"/", b"", "1.1", [])
    build_scope(request, server=None, client=None)["asgi"]["spec_version"] = "x"
    assert build_scope(request, server=None, client=None)["asgi"]["spec_version"] == "2.4"


@pytest.mark.parametrize("links", [b"</a>", "</a>", [b"</a>\r\nX: y"], ["</a>"], [1], 5])
def test_early_hint_links_that_are_not_byte_strings_are_an_app_error(links, caplog):
    async def app(scope, receive, send):
        await send({"type": "http.response.early_hint", "links": links})

    channel, cycle, _ = _run_cycle(app)
    assert channel.written == [simple_response(500, b"Internal Server Error")]
    assert "early hint" in caplog.text or "'links'" in caplog.text


def test_an_early_hint_goes_ahead_of_a_held_head_and_not_after_it():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        links = [b" </a.css>; rel=preload\t", bytearray(b"</b>")]
        await send({"type": "http.response.early_hint", "links": links})
        await send({"type": "http.response.body", "body": b"o", "more_body": True})
        await send({"type": "http.response.early_hint", "links": [b"</late>"]})  # the head left: dropped
        await send({"type": "http.response.body", "body": b"k"})

    channel, _, _ = _run_cycle(app)
    hint = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nLink: </b>\r\n\r\n"
    assert channel.written[0] == hint
    assert channel.written[1].startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"</late>" not in b"".join(channel.written)


def test_no_early_hint_for_http10_nor_the_extension():
    async def app(scope, receive, send):
        assert "http.response.early_hint" not in scope["extensions"]
        await send({"type": "http.response.early_hint", "links": [b"</a>"]})  # dropped, no error
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    channel, _, _ = _run_cycle(app, Request("GET", b"/", b"/", b"", "1.0", []))
    assert channel.written[0].startswith(b"HTTP/1.1 200 OK\r\n") and len(channel.written) == 1
