"""--health-path: liveness and readiness answered by the worker's loop, never by the app."""

from __future__ import annotations

import socket
import threading

import pytest
from conftest import read_to_end

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
