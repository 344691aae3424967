"""The connection contract over real sockets, for both loops: a client that stops sending its
body, or stops reading its response, is cut at the configured timeout while the worker goes on
serving others (and is not killed by the monitor)."""

from __future__ import annotations

import select
import socket
import time

import pytest
from conftest import read_to_end
from support.request_paths import connect, every_path, flags, over_http11_only

from refork.config import Config
from refork.http.parser import Limits
from refork.serving.connection import TICK, Expiry, Phase, Timeouts, request_limits

APPS = {"wsgi": "apps.timeouts:wsgi_app", "asgi": "apps.timeouts:asgi_app"}


def _start(start_server, interface: str, tmp_path, *args: str):
    access = tmp_path / "access.log"
    server = start_server(
        "--timeout", "60", "--access-logfile", str(access), *args, app=APPS[interface], workers=1
    )
    [worker] = server.workers()
    return server, access, worker["pid"]




@pytest.mark.parametrize("interface", ["asgi", "wsgi"])
def test_a_client_that_stops_sending_its_body_gets_408(start_server, tmp_path, interface):
    server, _, pid = _start(start_server, interface, tmp_path, "--body-timeout", "1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as silent:
        silent.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
        assert server.get("/") == (200, str(pid).encode())  # served meanwhile
        answer = read_to_end(silent)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert server.get("/") == (200, str(pid).encode())  # same worker: not killed


@pytest.mark.parametrize("interface", ["asgi", "wsgi"])
def test_the_body_deadline_is_a_total_a_trickle_does_not_rearm_it(start_server, tmp_path, interface):
    server, _, pid = _start(start_server, interface, tmp_path, "--body-timeout", "1")
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as trickle:
        trickle.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n")
        trickle.settimeout(0.3)
        answer = b""
        for _ in range(100):  # a byte every 0.3 s: 30 s for the whole body, were it not cut
            try:
                trickle.sendall(b"x")
                answer = trickle.recv(1024)
            except TimeoutError:
                continue
            except OSError:
                break
            break
        trickle.settimeout(20)
        answer += read_to_end(trickle)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert server.get("/") == (200, str(pid).encode())


@pytest.mark.parametrize("interface", ["asgi", "wsgi"])
def test_a_client_that_stops_reading_a_large_response_is_cut(start_server, tmp_path, interface):
    server, _, pid = _start(start_server, interface, tmp_path, "--write-timeout", "1", "--log-level", "debug")
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.settimeout(20)
    stalled.connect(("127.0.0.1", server.port))
    with stalled:
        stalled.sendall(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        assert server.get("/") == (200, str(pid).encode())  # another connection is served
        server.wait_for(lambda: "write timeout" in server.log(), what="the stalled response to be cut")
        received = len(read_to_end(stalled))
    assert received < 32 << 20
    assert server.get("/") == (200, str(pid).encode())  # same worker: not killed


def _response(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one response with a Content-Length, read off `sock` and no further."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(1 << 16)
        assert more, data
        data += more
    head, _, first = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    body = bytearray(first)  # (TLS reads come a record at a time: bytes += would be quadratic)
    while len(body) < length:
        more = sock.recv(1 << 20)
        assert more, (head, len(body))
        body += more
    return head, bytes(body)


@every_path
def test_keepalive_0_closes_each_connection_right_after_its_response(start_server, path):
    """--keepalive 0 (gunicorn's --keep-alive 0), over HTTP/1.1 on every path's listener (HTTP/2's
    idle connections: test_promises_http2.py): a keep-alive request's response says
    ``Connection: close``, arrives whole, and its connection ends at once (EOF, never a reset), not
    at the next once-a-second sweep (each of a few tries would land within 0.3 s of a sweep only by
    chance); a new connection is not idle-closed before its first request (it has --header-timeout);
    a big response its client reads late (a second after the server closed) arrives whole."""
    chosen, app = flags(path, "apps.promises")
    server = start_server(*chosen, "--keepalive", "0", app=app, workers=1)
    slow = connect(path, server.port)  # its request is sent after a sweep or more
    late = connect(path, server.port)  # its response is read then
    late.sendall(b"GET /big?30000000 HTTP/1.1\r\nHost: a\r\n\r\n")
    opened = time.monotonic()
    for url in ("/", "/", "/", "/big?3000000"):  # the whole response in one send, and a written-on one
        with connect(path, server.port) as sock:
            sock.sendall(f"GET {url} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            head, _ = _response(sock)
            answered = time.monotonic()
            end = sock.recv(1)  # a reset raises
            waited = time.monotonic() - answered
        assert b"\r\nconnection: close" in head.lower(), (url, head)
        assert end == b"" and waited < 0.3, (url, end, waited)
    # a request sent while the app has the one before it, or while its response is being written
    # (bigger than the sockets' buffers: not all out yet): dropped unanswered, and the close is a FIN
    # (closing with its bytes unread would be a reset, which destroys the response unread)
    for url, length in (("/sleep?0.5", 5), ("/big?30000000", 30000000)):
        with connect(path, server.port) as sock:
            sock.sendall(f"GET {url} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
            time.sleep(0.2)  # (the input, not a wait) the next request arrives meanwhile
            sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            head, body = _response(sock)
            assert len(body) == length and sock.recv(1) == b"", (url, head)
    with slow:
        time.sleep(max(0.0, opened + 2 * TICK - time.monotonic()))  # (the input) a client slower than a sweep
        slow.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        head, _ = _response(slow)
        assert head.startswith(b"HTTP/1.1 200 ") and b"\r\nconnection: close" in head.lower(), head
        assert slow.recv(1) == b""
    with late:
        head, body = _response(late)
        assert len(body) == 30000000 and b"\r\nconnection: close" in head.lower(), head
        assert late.recv(1) == b""


@over_http11_only("HTTP/2 ends a connection with GOAWAY, not Connection: close")
def test_writes_after_a_connection_close_response_meet_its_end_not_a_reset(start_server, path):
    """A client that writes on after it read a ``Connection: close`` response (a pipelined request
    sent too late) reads EOF and may write again: the server lingers, dropping those bytes, rather
    than answering them with a reset (which would fail that client's next write with EPIPE)."""
    chosen, app = flags(path, "apps.promises")
    server = start_server(*chosen, app=app, workers=1)
    for _ in range(5):
        with connect(path, server.port) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            head, _ = _response(sock)
            assert b"\r\nconnection: close" in head.lower(), head
            sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
            select.select([sock], [], [], 10)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")  # a reset would fail this (EPIPE)
            assert sock.recv(1) == b""  # a reset raises


# The contract's verdicts, without sockets ----------------------------------------------------

T = Timeouts(header=2.0, body=5.0, write=3.0, keepalive=4.0)


# (the verdicts themselves: tests/vectors/sweep.txt, shared with the native engines' sweep)


def test_what_the_sweep_leaves_to_others() -> None:
    assert T.expiry(Phase.BUSY, 0.0, 1e9) is Expiry.NONE  # the app's: the worker's --timeout
    assert T.expiry(Phase.WRITING, 0.0, 1e9) is Expiry.NONE  # judged by write_stalled()
    assert not T.write_stalled(0.0, time.monotonic())  # (0: not blocked)
    assert T.drain_until(100.0) == 101.0  # DRAIN_GRACE, shorter than keepalive
    assert T.keep_alive(False) and not T.keep_alive(True)  # True: the worker stops
    assert not Timeouts(header=2.0, body=5.0, write=3.0, keepalive=0.0).keep_alive(False)


def test_timeouts_from_config_are_their_own_not_the_workers() -> None:
    t = Timeouts.from_config(Config(timeout=7.0, header_timeout=3.0, keepalive=2.0))
    assert (t.header, t.keepalive) == (3.0, 2.0)
    assert (t.body, t.body_min_rate, t.write) == (30.0, 500.0, 30.0)  # not derived from --timeout


def test_limits_from_config() -> None:
    config = Config(
        limit_request_line=1, limit_request_fields=2, limit_request_field_size=3, limit_request_body=4
    )
    assert request_limits(config) == Limits(1, 2, 3, 4)
    assert request_limits(Config()) == Limits()
