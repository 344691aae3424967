"""--health-path: liveness and readiness answered by the worker's loop, never by the app."""

from __future__ import annotations

import socket
import threading

import pytest
from conftest import read_to_end
from support import h2client
from support.request_paths import connect, every_path, flags, http2, tls

HEALTH = "/_refork/health"
WSGI = "apps.lifecycle_apps:wsgi"


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return read_to_end(sock)


@pytest.mark.parametrize(
    ("app", "extra"),
    [("apps.lifecycle_apps:wsgi", []), ("apps.lifecycle_apps:wsgi", ["--threads", "4"]),
     ("apps.lifecycle_apps:asgi", [])],  # fmt: skip
    ids=["wsgi", "wsgi-threads", "asgi"],
)
def test_health_paths_are_answered_without_the_app(start_server, app, extra):
    server = start_server("--health-path", HEALTH, "--access-logfile", "-", *extra, app=app, workers=2)
    server.wait_for(lambda: server.get(f"{HEALTH}/ready")[0] == 200, what="readiness")
    for path in (HEALTH, f"{HEALTH}/live", f"{HEALTH}/ready"):
        status, body = server.get(path)
        assert (status, body) == (200, b"ok\n")
    assert server.get("/")[1].startswith(b"/ ")  # the app's
    assert server.get(f"{HEALTH}/other")[1].startswith(b"/_refork/health/other ")  # the app's too
    # HEAD: the head only; POST goes to the app; pipelined with app requests, in order
    head = raw(server.port, f"HEAD {HEALTH} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    posted = raw(server.port, f"POST {HEALTH} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
                              "Connection: close\r\n\r\n".encode())  # fmt: skip
    assert f"{HEALTH} ".encode() in posted
    pipelined = (
        f"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET {HEALTH}/ready HTTP/1.1\r\nHost: x\r\n\r\n"
        "GET /b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    piped = raw(server.port, pipelined.encode())
    assert piped.index(b"/a ") < piped.index(b"ok\n") < piped.index(b"/b ")
    # not counted as requests, not in the access log
    # (a worker counts a request as its response goes out, so the last count may come a little after)
    served = server.wait_for(lambda: (n := sum(w["requests"] for w in server.workers())) >= 5 and n)
    assert served == 5, server.status()
    log = server.log()
    assert "GET /a " in log and f"GET {HEALTH}/other " in log
    for check in (f"GET {HEALTH} ", f"GET {HEALTH}/live ", f"GET {HEALTH}/ready ", "HEAD "):
        assert check not in log


def test_liveness_answers_while_every_app_thread_is_busy(start_server):
    server = start_server("--health-path", HEALTH, "--threads", "2", app=WSGI, workers=1)
    busy = [threading.Thread(target=server.get, args=("/block?2",)) for _ in range(2)]
    for t in busy:
        t.start()
    server.wait_for(lambda: server.status()["processes"], what="status")
    try:
        assert server.get(HEALTH, timeout=1.5) == (200, b"ok\n")
    finally:
        for t in busy:
            t.join()


def test_http_1_0_health_check_closes(start_server):
    server = start_server("--health-path", HEALTH, app="apps.lifecycle_apps:asgi", workers=1)
    reply = raw(server.port, f"GET {HEALTH}/live HTTP/1.0\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and b"Connection: close" in reply
    assert reply.endswith(b"ok\n")


@every_path
def test_a_health_path_request_with_a_body_is_the_apps_and_the_connection_goes_on(start_server, path):
    """tests/vectors/health.txt's rule on a real server: a body (announced or not) makes a health
    path's request the app's; the requests after it on the connection are read where they start."""
    chosen, app = flags(path, "apps.access_apps")
    server = start_server(*chosen, "--health-path", HEALTH, app=app, workers=1)
    if http2(path):
        client = h2client.H2Client(server.port, 10.0, tls=tls(path))
        try:
            sid = client.conn.get_next_available_stream_id()  # a body no content-length announces
            head = [(":method", "GET"), (":path", f"{HEALTH}/live"), (":scheme", client.scheme),
                    (":authority", "127.0.0.1")]  # fmt: skip
            client.conn.send_headers(sid, head, end_stream=False)
            client.answers[sid] = (0, bytearray(), False)
            client.send_data(sid, b"hello", end=True)
            assert client.response(sid) == (200, b"hello\n")
            assert client.request("GET", f"{HEALTH}/live", body=b"hello") == (200, b"hello\n")
            assert client.request("GET", HEALTH) == (200, b"ok\n")
            assert client.request("GET", "/after") == (200, b"hello\n")
        finally:
            client.close()
        return
    with connect(path, server.port) as sock:
        sock.sendall(f"GET {HEALTH}/live HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
                     f"HEAD {HEALTH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     "5\r\nhello\r\n0\r\n\r\n"
                     f"GET {HEALTH}?probe=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                     "GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
        reply = read_to_end(sock)
    answers = reply.split(b"HTTP/1.1 ")[1:]
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"200 OK"] * 4, reply
    assert [a.rsplit(b"\r\n\r\n", 1)[1] for a in answers] == [b"hello\n", b"", b"ok\n", b"hello\n"], reply
    assert b"x-quote" in answers[1].lower()  # the HEAD's head is the app's
