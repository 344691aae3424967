"""The WSGI connection loop over real sockets: keep-alive, pipelining, framing, timeouts, stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

import pytest
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from apps import Reader, Server  # noqa: E402


@pytest.fixture(scope="module", params=[1, 4], ids=["threads1", "threads4"])
def server(request):
    srv = Server("apps.wsgi_apps:app", threads=request.param)
    srv.threads = request.param
    yield srv
    srv.stop()


def stats(srv: Server) -> dict:
    return requests.get(srv.url("/stats")).json()


def test_keep_alive_reuses_the_connection(server):
    sock = server.connect()
    reader = Reader(sock)
    for i in range(3):
        sock.sendall(b"GET /environ?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i)
        status, headers, body = reader.response()
        assert status == 200 and json.loads(body)["QUERY_STRING"] == f"n={i}"
    sock.close()


def test_pipelined_requests_answered_in_order(server):
    sock = server.connect()
    reader = Reader(sock)
    batch = b"".join(b"GET /environ?n=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(30))
    batch += b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    batch += b"GET /environ?n=last HTTP/1.1\r\nHost: x\r\n\r\n"
    sock.sendall(batch)
    for i in range(30):
        status, _, body = reader.response()
        assert status == 200 and json.loads(body)["QUERY_STRING"] == f"n={i}"
    assert reader.response()[2] == b"hello"
    assert json.loads(reader.response()[2])["QUERY_STRING"] == "n=last"
    # a request split across sends, the second half arriving with the next request
    sock.sendall(b"GET /environ?n=a HTTP/1.1\r\nHo")
    time.sleep(0.05)
    sock.sendall(b"st: x\r\n\r\nGET /environ?n=b HTTP/1.1\r\nHost: x\r\n\r\n")
    assert json.loads(reader.response()[2])["QUERY_STRING"] == "n=a"
    assert json.loads(reader.response()[2])["QUERY_STRING"] == "n=b"
    sock.close()


def test_chunked_request_body(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n1;ext=1\r\n \r\n"
    )
    time.sleep(0.05)
    sock.sendall(b"5\r\nworld\r\n0\r\n\r\n")
    status, _, body = reader.response()
    assert status == 200 and body == b"hello world"
    sock.close()


def test_expect_100_continue(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    status, _, _ = reader.response()
    assert status == 100
    sock.sendall(b"body")
    status, _, body = reader.response()
    assert status == 200 and body == b"body"
    sock.close()


def test_head_request(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(b"HEAD /environ HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = reader.response(head=True)
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0
    status, _, body = reader.response()  # the next response follows directly: no body was sent
    assert status == 200 and body == b"root"
    sock.close()


def test_http10_and_connection_close(server):
    for raw in (
        b"GET /environ HTTP/1.0\r\n\r\n",
        b"GET /environ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ):
        sock = server.connect()
        reader = Reader(sock)
        sock.sendall(raw)
        status, headers, body = reader.response()
        assert status == 200
        assert json.loads(body)["SERVER_PROTOCOL"] == ("HTTP/1.0" if b"1.0" in raw else "HTTP/1.1")
        assert reader.closed()
        sock.close()


def test_malformed_request_is_400_and_app_not_called(server):
    before = stats(server)["calls"]
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
    status, _, _ = reader.response()
    assert status == 400 and reader.closed()
    sock.close()
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")  # HTTP/1.1 without Host
    assert reader.response()[0] == 400 and reader.closed()
    sock.close()
    assert stats(server)["calls"] == before + 1  # only the /stats call itself


def test_app_error_is_500(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(b"GET /error HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reader.response()[0] == 500
    sock.close()
    assert requests.get(server.url("/")).status_code == 200


def test_concurrent_slow_requests(server):
    results = []

    def get():
        results.append(requests.get(server.url("/slow?t=0.6")).text)

    workers = [threading.Thread(target=get) for _ in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert results == ["slept"] * 4
    if server.threads > 1:
        assert stats(server)["max_active"] >= 2
    else:
        assert stats(server)["max_active"] == 1


def test_slow_header_and_idle_connections_are_closed(server):
    """The harness sets header_timeout = keepalive = 2 s."""
    slow = server.connect(timeout=15)
    slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Half: ")
    idle = server.connect(timeout=15)
    idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    idle_reader = Reader(idle)
    assert idle_reader.response()[0] == 200
    slow_reader = Reader(slow)
    # the slow one gets a 408 (or just EOF) and then EOF; the idle one just EOF
    try:
        status = slow_reader.response()[0]
        assert status == 408
    except EOFError:
        pass
    assert slow_reader.closed()
    assert idle_reader.closed()
    # meanwhile the server still serves
    assert requests.get(server.url("/")).status_code == 200
    slow.close()
    idle.close()


def test_slow_body_keeps_working_while_others_are_served(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    assert requests.get(server.url("/")).text == "root"  # the loop is not blocked by it
    sock.sendall(b"67890")
    assert reader.response()[2] == b"1234567890"
    sock.close()


@pytest.mark.parametrize("threads", [1, 4])
def test_graceful_stop_completes_in_flight_request(threads):
    srv = Server("apps.wsgi_apps:app", threads=threads)
    idle = srv.connect()
    idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    idle_reader = Reader(idle)
    assert idle_reader.response()[0] == 200
    busy = srv.connect()
    busy.sendall(b"GET /slow?t=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    if threads > 1:
        for _ in range(200):
            if stats(srv)["active"] == 1:
                break
            time.sleep(0.01)
    else:
        time.sleep(0.3)
    srv.proc.send_signal(signal.SIGTERM)
    busy_reader = Reader(busy)
    status, headers, body = busy_reader.response()
    assert status == 200 and body == b"slept"
    assert busy_reader.closed()  # answered, then closed: the worker is stopping
    assert idle_reader.closed()
    rc, out = srv.stop(None)
    assert rc == 0 and "SERVED" in out
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=2)


def test_immediate_stop_with_idle_connections():
    srv = Server("apps.wsgi_apps:app")
    idle = srv.connect()
    idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert Reader(idle).response()[0] == 200
    rc, _ = srv.stop(signal.SIGINT)
    assert rc == 0
    idle.close()
