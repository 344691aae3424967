"""The ASGI serving loop over real sockets: a graceful stop and SIGINT, a slow reader (drain) with the
access log, asyncio and uvloop on a Unix socket with the keep-alive and header timeouts, and the fork
at a safe point (the child unwinds, the parent serves on).
"""

from __future__ import annotations

import json
import signal
import socket

import pytest
from conftest import pids_alive
from support.asgi_server import at_eof, exchange, read_response
from support.waits import process_state, sender_blocked, wait_for_line, wait_until


def test_graceful_stop_lets_in_flight_request_finish(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    idle = proc.connect()
    idle.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    read_response(idle)
    with proc.connect() as sock:
        sock.sendall(b"GET /slow?1 HTTP/1.1\r\nHost: a\r\n\r\n")
        wait_for_line(logfile, "slow")  # the request is in the app
        proc.proc.send_signal(signal.SIGTERM)
        status, headers, body = read_response(sock)
        assert (status, body) == (200, b"slow done")
        assert headers["connection"] == "close"
    assert at_eof(idle)  # the idle keep-alive connection was closed
    idle.close()
    code, out, err = proc.finish(sig=0)
    assert code == 0 and "SERVED 2" in out


def test_sigint_stops_at_once(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    with proc.connect() as sock:
        sock.sendall(b"GET /slow?30 HTTP/1.1\r\nHost: a\r\n\r\n")
        wait_for_line(logfile, "slow")  # the request is in the app
        code, out, err = proc.finish(sig=signal.SIGINT, timeout=5)
    assert code == 0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_streamed_response_with_slow_reader_and_access_log(serve, loop, tmp_path):
    access = tmp_path / "access.log"
    proc = serve(loop=loop, env={"ACCESS_LOG": str(access)})
    with proc.connect(timeout=10) as sock:
        sock.sendall(b"GET /stream?300 HTTP/1.1\r\nHost: a\r\n\r\n")
        # not reading: the server hits its write buffer limit and must wait (drain)
        wait_until(lambda: sender_blocked(sock), what="the server blocked on the unread socket")
        status, headers, body = read_response(sock)
        assert status == 200 and len(body) == 300 * 65536
        sock.sendall(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, body = read_response(sock)
        assert body == b"GET /hello" and headers["connection"] == "keep-alive"
    code, out, err = proc.finish()
    assert code == 0, err
    lines = access.read_text().splitlines()
    assert len(lines) == 2 and '"GET /stream?300 HTTP/1.1" 200 19660800' in lines[0], lines


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_both_loops_keepalive_timeout_and_unix_socket(serve, loop, tmp_path):
    path = str(tmp_path / "s.sock")
    proc = serve(loop=loop, unix=path)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"GET /scope HTTP/1.1\r\nHost: a\r\n\r\n")
        status, _, body = read_response(sock)
        info = json.loads(body)
        assert info["client"] is None and info["server"] == [path, None]
        assert at_eof(sock)  # keep-alive timeout (1 s) closes the idle connection
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"GET / HTTP/1.1\r\nHost:")
        assert read_response(sock)[0] == 408  # header timeout (1 s)
        assert at_eof(sock)
    code, out, err = proc.finish()
    assert code == 0, err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_safe_point_fork_child_unwinds_and_parent_keeps_serving(serve, loop):
    proc = serve(loop=loop, mode="fork")
    before = proc.connect()  # open across the fork
    with proc.connect() as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock)[2] == b"GET /first"
    lines = sorted(proc.proc.stdout.readline() for _ in range(2))
    assert lines[0] == "CHILD UNWOUND\n", lines  # the SystemExit subclass left serve_asgi
    assert lines[1].startswith("FORKED"), lines
    child = int(lines[1].split()[1])
    # The parent still accepts and serves, also on the connection that existed at fork time...
    for _ in range(3):
        assert exchange(proc, b"GET /again HTTP/1.1\r\nHost: a\r\n\r\n")[2] == b"GET /again"
    before.sendall(b"GET /old-conn HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert read_response(before)[2] == b"GET /old-conn"
    # ...and when the parent closes it, the client sees EOF although the child is still alive.
    before.settimeout(2)
    assert at_eof(before)
    assert pids_alive([child]) == [child]
    before.close()
    code, out, err = proc.finish()
    assert code == 0, err
    assert "SERVED 5" in out
    wait_until(lambda: process_state(child) in (None, "Z"), what="the child to follow its parent")


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_a_connection_accepted_in_the_iteration_that_stops_accepting_is_served(loop_name):
    """The stop comes in the loop iteration that accepted a connection (its transport is made in
    the next): the connection is still served, not refused by a closed server and left open."""
    import asyncio
    import select

    import uvloop

    from refork.serving.asgi.server import stop_accepting

    loop = uvloop.new_event_loop() if loop_name == "uvloop" else asyncio.new_event_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    made: list[asyncio.BaseTransport] = []

    class Made(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            made.append(transport)

    async def turns(n: int) -> None:
        for _ in range(n):
            await asyncio.sleep(0)

    try:
        server = loop.run_until_complete(loop.create_server(Made, sock=listener))
        with socket.create_connection(listener.getsockname()) as client:
            assert select.select([listener], [], [], 5)[0]  # waiting in the backlog
            # a timer due now runs after the accept's callback in the same iteration (asyncio)
            loop.call_at(loop.time(), stop_accepting, loop, [server], [listener])
            loop.run_until_complete(turns(10))
            assert len(made) == 1
            made[0].close()
            loop.run_until_complete(turns(2))
            client.settimeout(5)
            assert client.recv(1) == b""  # closed by the server: not held open unserved
        assert not server.is_serving()
    finally:
        loop.close()
        listener.close()
