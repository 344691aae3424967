"""WebSocket limits on real servers: --ws-max-size (1009, also after decompression and for a deflate
bomb), --write-timeout, --ws-max-queue, pings and their timeout (1011) and backpressure on a client
that does not read.
"""

from __future__ import annotations

import time

import pytest
from support.waits import sender_blocked, wait_until
from support.websocket import APP, BINARY, PING, PONG, TEXT, RawWebSocket, url
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from refork.memory.accounting import read_memory


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
