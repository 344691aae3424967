"""Open WebSockets when the server stops or renews its workers: a stop closes them 1001 (also when
the app ignores the disconnect), a reload 1012, and a refork promotes the worker holding one.
"""

from __future__ import annotations

import signal
import struct
import time

import pytest
from conftest import pids_alive
from support.websocket import APP, CLOSE, RawWebSocket, open_client, url
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect


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
