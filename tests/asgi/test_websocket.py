"""WebSockets on real servers (the CLI) with the `websockets` client and raw sockets: handshake,
echo, subprotocols and the scope on both loops and over TLS, per-message deflate, refusals (403, 500,
denial), close codes and the access log, status and metrics, --ws none, WSGI apps (400) and a
pipelined upgrade.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.request
from typing import Any

import pytest
from conftest import free_port, run_cli
from support.websocket import APP, RawWebSocket, open_client, url
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect


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
