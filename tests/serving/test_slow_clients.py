"""One client must never cost other clients their requests (issue 8), over real sockets.

The worker's deadline (``--timeout``, enforced by the monitor's SIGKILL) counts time *in the app*
only; time waiting on a client is bounded per connection by the body and write timeouts. A
response the client reads slowly (or never) holds neither the loop nor the whole body in memory.
Every server here runs one worker with ``--timeout 2``: were client time counted, it would be
killed mid-test and its pid would change.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from conftest import read_to_end
from support.process_memory import rss_kib
from support.waits import sender_blocked, wait_until

APPS = {"wsgi": "apps.slow_clients:wsgi_app", "asgi": "apps.slow_clients:asgi_app"}
MB = 1 << 20


def _start(start_server, interface: str, *args: str, threads: int = 1):
    extra = ["--threads", str(threads)] if interface == "wsgi" else []
    server = start_server("--timeout", "2", *extra, *args, app=APPS[interface], workers=1)
    [worker] = server.workers()
    return server, worker["pid"]


def _same_worker(server, pid: int) -> bool:
    return server.get("/") == (200, str(pid).encode())


def _connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # no autotuning: reads pace it
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    return sock




def _download_slowly(port: int, path: str, pause: float = 0.05) -> tuple[bytes, int]:
    """GET path reading 64 KiB per `pause`: (head, body bytes); the reads set the pace."""
    with _connect(port, rcvbuf=1 << 16) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data:
            piece = sock.recv(1 << 16)
            if not piece:
                return data, 0
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        received = len(body)
        while True:
            time.sleep(pause)  # (the input, not a wait) the slow reader's pace
            try:
                piece = sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not piece:
                break
            received += len(piece)
        return head, received


class Background(threading.Thread):
    def __init__(self, target, *args) -> None:
        super().__init__(daemon=True)
        self._call = (target, args)
        self.result = None

    def run(self) -> None:
        target, args = self._call
        self.result = target(*args)

    def value(self, timeout: float = 60.0):
        self.join(timeout)
        assert not self.is_alive(), "the background client did not finish"
        return self.result


# 1. The worker deadline is time in the app --------------------------------------------------


def test_asgi_a_silent_body_gets_408_while_a_bystanders_download_on_the_worker_completes(start_server):
    server, pid = _start(start_server, "asgi", "--body-timeout", "4", "--body-min-rate", "0")
    bystander = Background(_download_slowly, server.port, f"/big?{8 * MB}")
    bystander.start()
    with _connect(server.port) as silent:
        silent.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc")
        answer = read_to_end(silent)  # the app waits in receive(): the client's time
    assert answer.startswith(b"HTTP/1.1 408 ")
    head, received = bystander.value()
    assert head.startswith(b"HTTP/1.1 200 ") and received == 8 * MB
    assert _same_worker(server, pid)


@pytest.mark.parametrize(("interface", "threads"), [("asgi", 1), ("wsgi", 1), ("wsgi", 2)])
def test_a_client_that_stops_reading_is_cut_by_the_write_timeout_and_logged(start_server, interface, threads):
    server, pid = _start(start_server, interface, "--write-timeout", "4", threads=threads)
    with _connect(server.port, rcvbuf=4096) as stalled:
        stalled.sendall(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        assert _same_worker(server, pid)  # served meanwhile
        server.wait_for(lambda: "write timeout" in server.log(), what="the stalled response to be cut")
        assert len(read_to_end(stalled)) < 50 * MB
    line = next(line for line in server.log().splitlines() if "write timeout" in line)
    assert "WARNING" in line and "GET /big" in line and "127.0.0.1:" in line
    assert _same_worker(server, pid)  # not killed at --timeout


@pytest.mark.parametrize(("interface", "threads"), [("wsgi", 1), ("wsgi", 2), ("asgi", 1)])
def test_a_slow_but_steady_download_longer_than_timeout_completes(start_server, interface, threads):
    server, pid = _start(start_server, interface, "--write-timeout", "5", threads=threads)
    head, received = _download_slowly(server.port, f"/big?{8 * MB}")  # ~6 s of 64 KiB reads
    assert head.startswith(b"HTTP/1.1 200 ") and received == 8 * MB
    assert _same_worker(server, pid)


def test_time_in_the_app_still_holds_the_deadline(start_server):
    """A response started and then stuck in the app (in next() of its body, pulled after the
    socket had filled up and the client read on) gets the worker replaced."""
    server, pid = _start(start_server, "wsgi")
    with _connect(server.port, rcvbuf=4096) as stuck:
        stuck.sendall(b"GET /stuck HTTP/1.1\r\nHost: a\r\n\r\n")
        received = len(read_to_end(stuck))  # until the monitor's SIGKILL ends the connection
        assert received < 5 << 20
        server.wait_for(lambda: [w["pid"] for w in server.workers()] not in ([], [pid]),
                        what="the stuck worker to be replaced")  # fmt: skip
    assert "timeout" in server.log()


def test_an_asgi_response_awaiting_past_timeout_costs_its_worker_nothing(start_server):
    """The ASGI deadline watches the event loop: a started response whose app awaits for longer
    than --timeout (2 s) holds no thread, so the worker keeps serving and is never killed for it."""
    server, pid = _start(start_server, "asgi")
    with _connect(server.port) as stuck:
        stuck.sendall(b"GET /stuck HTTP/1.1\r\nHost: a\r\n\r\n")
        assert stuck.recv(100).startswith(b"HTTP/1.1 200")
        until = time.monotonic() + 4  # a negative: nothing may happen in twice --timeout
        while time.monotonic() < until:
            assert _same_worker(server, pid)
    assert "killing it" not in server.log()


@pytest.mark.parametrize("interface", ["asgi", "wsgi"])
def test_a_body_trickled_a_byte_every_3s_hits_the_total_body_deadline(start_server, interface):
    server, pid = _start(start_server, interface, "--body-timeout", "4")
    with _connect(server.port) as trickle:
        trickle.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n")
        trickle.settimeout(3)
        answer = b""
        for _ in range(30):  # 90 s for the whole body were the deadline re-armed per read
            try:
                answer = trickle.recv(1024)
                break
            except TimeoutError:
                trickle.sendall(b"x")
        trickle.settimeout(30)
        answer += read_to_end(trickle)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert _same_worker(server, pid)


# 2. A client that never reads blocks nobody, and holds no body in memory ----------------------


@pytest.mark.parametrize("path", ["/big", f"/file?{50 * MB}"])
def test_wsgi_single_thread_a_client_that_never_reads_blocks_nobody(start_server, path):
    server, pid = _start(start_server, "wsgi")  # the default write timeout: 30 s
    with _connect(server.port, rcvbuf=4096) as stalled:
        stalled.sendall(f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        for _ in range(5):
            assert _same_worker(server, pid)  # at once, not after the write timeout
        stalled.settimeout(30)
        stalled.setblocking(True)
        total = 0
        while total < 50 * MB:  # then the stalled client reads: it gets all of it
            piece = stalled.recv(1 << 20)
            assert piece
            total += len(piece)
    assert total >= 50 * MB


@pytest.mark.parametrize("interface", ["asgi", "wsgi"])
def test_a_never_read_50mb_response_is_not_held_in_memory(start_server, interface):
    server, pid = _start(start_server, interface)
    assert server.get(f"/big?{MB}")[0] == 200  # warm: the route's own allocations
    before = rss_kib(pid)  # nothing in flight
    with _connect(server.port, rcvbuf=4096) as stalled:
        stalled.sendall(b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n")
        assert _same_worker(server, pid)
        # the response is parked on the client: the socket full, the request out of the app
        wait_until(
            lambda: sender_blocked(stalled) and server.workers()[0]["busy"] == 0,
            what="the response parked on the client",
        )
        grown = rss_kib(pid) - before
    assert grown < 20 * 1024, f"worker RSS grew by {grown} KiB for a response nobody reads"
