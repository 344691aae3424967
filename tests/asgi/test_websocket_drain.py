"""Open WebSockets across a refork: the retired worker serves them on (--ws-drain-timeout), counted
by `refork status`, while its replacement serves everything new; a stop (TERM) still closes them
with 1001, and the drain limit with 1012. Real servers, on both loops."""

from __future__ import annotations

import signal
import time

import pytest
from conftest import pids_alive
from support.websocket import APP
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

loops = pytest.mark.parametrize("loop", ["asyncio", "uvloop"])


def _open(server):
    """A WebSocket to /pid kept open across statements, and the pid of the worker serving it."""
    ws = connect(f"ws://127.0.0.1:{server.port}/pid", ping_interval=None).__enter__()
    return ws, int(ws.recv())


def _refork(server, old: int) -> dict:
    """A refork and its rollout done: the status row of the retired worker `old`."""
    assert server.request("refork")["ok"] is True
    server.wait_for(lambda: [w["generation"] for w in server.workers()] == [1], what="the rollout")
    rows = [p for p in server.status()["processes"] if p["pid"] == old]
    assert rows and rows[0]["state"] == "stopping", rows
    return rows[0]


@loops
def test_a_refork_keeps_open_websockets_and_a_stop_closes_them_1001(loop, start_server):
    server = start_server("--loop", loop, "--graceful-timeout", "5", app=APP, workers=1)
    ws, old = _open(server)
    retired = _refork(server, old)
    assert retired["websockets"] == 1  # refork status counts it
    ws.send("after the refork")
    assert ws.recv(timeout=10) == "after the refork"  # served on by the retired worker
    with connect(f"ws://127.0.0.1:{server.port}/pid", ping_interval=None) as fresh:
        assert int(fresh.recv()) != old  # anything new goes to its replacement
    assert [w["generation"] for w in server.workers()] == [1]  # the retired one counts for nothing
    began = time.monotonic()
    server.signal(signal.SIGTERM)
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=20)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1001
    ws.close()
    assert server.wait_exit(20) == 0
    assert time.monotonic() - began < 15  # within --graceful-timeout, not the drain limit
    assert "killing" not in server.log()


@loops
def test_the_drain_limit_closes_them_1012(loop, start_server):
    """Past --graceful-timeout the monitor leaves the retired worker serving its WebSocket (killed,
    it would drop it without a close frame); the drain limit closes it with 1012."""
    server = start_server("--loop", loop, "--graceful-timeout", "1", "--ws-drain-timeout", "4", app=APP,
                          workers=1)  # fmt: skip
    ws, old = _open(server)
    _refork(server, old)
    began = time.monotonic()
    with pytest.raises(ConnectionClosed) as info:
        while True:
            ws.send("still here")
            assert ws.recv(timeout=20) == "still here"
            time.sleep(0.2)  # (the client's pace, not a wait for a state)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1012, info.value
    assert time.monotonic() - began > 1.5  # served on past --graceful-timeout
    ws.close()
    server.wait_for(lambda: not pids_alive([old]), what="the retired worker's exit")
    assert "killing" not in server.log()


def test_a_websocket_closed_by_its_client_lets_the_retired_worker_go(start_server):
    server = start_server(app=APP, workers=1)
    ws, old = _open(server)
    _refork(server, old)
    ws.close()
    server.wait_for(lambda: f"(pid {old}, gen 0) exited" in server.log(), what="the retired worker's exit")
    assert f"(pid {old}, gen 0) exited with code 0" in server.log()
