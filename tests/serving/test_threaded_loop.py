"""The WSGI connection loop over real sockets: keep-alive, pipelining, framing, timeouts, stop."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import pytest
import requests
from apps import Reader, Server  # noqa: E402
from apps.wsgi_apps import STATS  # noqa: E402 - the app the in-thread servers run
from support.waits import sleeping_threads, wait_until  # noqa: E402


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
    time.sleep(0.05)  # (the input, not a wait) the halves arrive apart
    sock.sendall(b"st: x\r\n\r\nGET /environ?n=b HTTP/1.1\r\nHost: x\r\n\r\n")
    assert json.loads(reader.response()[2])["QUERY_STRING"] == "n=a"
    assert json.loads(reader.response()[2])["QUERY_STRING"] == "n=b"
    sock.close()


def test_chunked_request_body(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1;ext=1\r\n \r\n"
    )
    time.sleep(0.05)  # (the input, not a wait) the chunks arrive apart
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


BAD_HEAD = b"GET /bad HTTP/1.1\r\nHost x\r\n\r\n"  # a field line without its colon


def test_pipeline_valid_invalid_valid_answers_the_first_then_400(server):
    """RFC 9112 9.3.2: requests before the bad one are answered in order, fully written (13 MB:
    more than the socket buffers, so threads=1 waits for the client to read), then the 400."""
    before = stats(server)["calls"]
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(
        b"GET /environ?n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /closing-big HTTP/1.1\r\nHost: x\r\n\r\n"
        + BAD_HEAD
        + b"GET /environ?n=2 HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    status, _, body = reader.response()
    assert status == 200 and json.loads(body)["QUERY_STRING"] == "n=1"
    status, _, body = reader.response()
    assert status == 200 and body == b"x" * (65536 * 200)
    assert reader.response()[0] == 400 and reader.closed()
    sock.close()
    assert stats(server)["calls"] == before + 2 + 1  # n=2 never reached the app


def test_pipeline_with_a_bad_chunked_body_answers_the_first_then_400(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(
        b"GET /environ?n=1 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n"
    )
    status, _, body = reader.response()
    assert status == 200 and json.loads(body)["QUERY_STRING"] == "n=1"
    assert reader.response()[0] == 400 and reader.closed()
    sock.close()


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


def test_header_clock_restarts_for_each_request(server):
    """Two heads, each sent in two parts 1.2 s apart: within header_timeout (2 s) one at a time."""
    if server.threads > 1:
        pytest.skip("same code path; once is enough")
    sock = server.connect()
    reader = Reader(sock)
    for _ in range(2):
        sock.sendall(b"GET / HTTP/1.1\r\nHo")
        time.sleep(1.2)  # (the input, not a wait) a slow client: over half the header timeout
        sock.sendall(b"st: x\r\n\r\n")
        assert reader.response()[0] == 200
    sock.close()


def test_slow_body_keeps_working_while_others_are_served(server):
    sock = server.connect()
    reader = Reader(sock)
    sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    assert requests.get(server.url("/")).text == "root"  # the loop is not blocked by it
    sock.sendall(b"67890")
    assert reader.response()[2] == b"1234567890"
    sock.close()


def test_request_sent_during_a_long_app_call_is_not_dropped_as_idle(server):
    """threads == 1: the loop is blocked past keepalive (2 s); the waiting request still gets served."""
    if server.threads > 1:
        pytest.skip("only the single-thread loop blocks")
    other = server.connect()
    other_reader = Reader(other)
    other.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert other_reader.response()[0] == 200
    busy = server.connect()
    busy.sendall(b"GET /slow?t=2.5 HTTP/1.1\r\nHost: x\r\n\r\n")
    wait_until(lambda: sleeping_threads(server.proc.pid), what="the loop in the app (time.sleep)")
    other.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert Reader(busy).response()[2] == b"slept"
    assert other_reader.response()[2] == b"root"
    busy.close()
    other.close()


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
        wait_until(lambda: stats(srv)["active"] == 1, what="the request in the app")
    else:  # the loop itself is in the app: it cannot answer /stats
        wait_until(lambda: sleeping_threads(srv.proc.pid), what="the loop in the app (time.sleep)")
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


# ------------------------------------------------------------------------------ in-process loop


class Control:
    """A WorkerControl driven by the test: flags plus a socketpair to wake the loop."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self.stopping = False
        self.exit_now = False
        self.safe_point_wanted = False
        self.server_draining = False
        self.websocket_grace = 0.0
        self.free_threads_elsewhere = False  # the only loop
        self.ready_status = 200
        # the threads the loop started (a Python thread, and any OS thread: a native one too), by
        # name, at each safe point; the process's threads from before (a previous test's, still
        # ending) are not the loop's
        self.safe_point_threads: list[list[str]] = []
        self.safe_point_tasks: list[list[str]] = []
        self._threads_before = {t.ident for t in threading.enumerate()}
        self._tasks_before = set(os.listdir("/proc/self/task"))
        self.safe_points_at: list[float] = []
        self.raise_at_safe_point: BaseException | None = None
        self.ticks = 0
        self.wakes = 0  # wake-ups the loop has read

    def fileno(self) -> int:
        return self._r.fileno()

    def free_threads_address(self) -> int:
        return 0

    def on_readable(self) -> None:
        try:
            self._r.recv(64)
        except BlockingIOError:
            pass
        self.wakes += 1

    def wake(self, **flags) -> None:
        for name, value in flags.items():
            setattr(self, name, value)
        self._w.send(b"x")

    def at_safe_point(self) -> None:
        started = [t for t in threading.enumerate() if t.ident not in self._threads_before]
        self.safe_point_threads.append([t.name for t in started])
        self.safe_point_tasks.append(_task_names(self._tasks_before))
        self.safe_points_at.append(time.monotonic())
        self.safe_point_wanted = False
        if self.raise_at_safe_point is not None:
            raise self.raise_at_safe_point

    def request_started(self, method: str, path: bytes) -> object:
        return None

    def request_waiting(self, token: object) -> None:
        pass

    def request_resumed(self, token: object) -> None:
        pass

    def request_finished(self, token: object, status: int) -> None:
        pass

    def health(self, kind: str) -> int:
        return self.ready_status if kind == "ready" else 200

    def tick(self) -> None:
        self.ticks += 1

    def ready_for_requests(self) -> None:
        pass


def _task_names(before: set[str]) -> list[str]:
    """The names of the process's OS threads but those in `before` (by id)."""
    tasks = set(os.listdir("/proc/self/task")) - before
    names = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # ended meanwhile
            pass
    return names


def serve_in_thread(listeners, threads=1, **config):
    from apps.wsgi_apps import app

    from refork.config import Config
    from refork.serving import serve

    control = Control()
    config.setdefault("wsgi_loop", os.environ.get("REFORK_WSGI_LOOP", "auto"))  # once per WSGI loop
    outcome: list[BaseException | None] = []

    def run():
        try:
            serve(listeners, app, "wsgi", Config(threads=threads, keepalive=5.0, **config), control)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome.append(e)

    thread = threading.Thread(target=run, name="test-loop")
    thread.start()
    return control, thread, outcome


def tcp_listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


class Promoted(SystemExit):
    """Stands in for the worker's 'become the mold' exception."""


def test_safe_point_joins_pool_threads_and_lets_systemexit_through():
    lsock = tcp_listener()
    control, thread, outcome = serve_in_thread([lsock], threads=3)
    try:
        port = lsock.getsockname()[1]
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        reader = Reader(idle)
        assert reader.response()[2] == b"root"
        control.wake(safe_point_wanted=True)
        wait_until(lambda: control.safe_point_threads, what="the safe point")
        assert not [n for n in control.safe_point_threads[0] if n.startswith("refork-wsgi")]
        assert not [n for n in control.safe_point_tasks[0] if n.startswith("refork-")]  # the I/O thread too
        # the pool is back and the idle keep-alive connection still works
        idle.sendall(b"GET /environ HTTP/1.1\r\nHost: x\r\n\r\n")
        assert json.loads(reader.response()[2])["wsgi.multithread"] is True
        control.raise_at_safe_point = Promoted(0)
        control.wake(safe_point_wanted=True)
        thread.join(10)
        assert not thread.is_alive() and isinstance(outcome[0], Promoted)
        assert reader.closed()  # the loop's sockets were closed on the way out
        idle.close()
    finally:
        control.wake(exit_now=True)
        thread.join(10)
        lsock.close()


def test_unix_listener(tmp_path):
    path = str(tmp_path / "s.sock")
    lsock = socket.socket(socket.AF_UNIX)
    lsock.bind(path)
    lsock.listen(16)
    control, thread, outcome = serve_in_thread([lsock])
    try:
        client = socket.socket(socket.AF_UNIX)
        client.settimeout(10)
        client.connect(path)
        client.sendall(b"GET /environ HTTP/1.1\r\nHost: example.org\r\n\r\n")
        env = json.loads(Reader(client).response()[2])
        assert env["REMOTE_ADDR"] == "" and env["SERVER_NAME"] == "example.org"
        client.close()
        control.wake(stopping=True)
        thread.join(10)
        assert not thread.is_alive() and outcome == [None]
    finally:
        control.wake(exit_now=True)
        thread.join(10)
        lsock.close()


def test_access_log(tmp_path):
    log_path = tmp_path / "access.log"
    lsock = tcp_listener()
    control, thread, outcome = serve_in_thread([lsock], access_logfile=str(log_path))
    try:
        port = lsock.getsockname()[1]
        assert requests.get(f"http://127.0.0.1:{port}/environ?x=1").status_code == 200
        control.wake(stopping=True)
        thread.join(10)
        assert outcome == [None]
        line = log_path.read_text()
        assert "GET /environ?x=1" in line and " 200 " in line
    finally:
        control.wake(exit_now=True)
        thread.join(10)
        lsock.close()


def test_a_blocking_write_to_a_client_that_never_reads_times_out_and_is_the_clients_time():
    from refork.serving.outbox import Outbox

    class Waits(Control):
        def __init__(self) -> None:
            super().__init__()
            self.waits: list[str] = []

        def request_waiting(self, token: object) -> None:
            self.waits.append("waiting")

        def request_resumed(self, token: object) -> None:
            self.waits.append("resumed")

    a, b = socket.socketpair()
    a.setblocking(False)
    control = Waits()
    out = Outbox(a, None, 0.2, control, buffering=False)
    with pytest.raises(TimeoutError):
        out.send(b"x" * 20_000_000)
    assert control.waits[-2:] == ["waiting", "resumed"]  # not counted against --timeout
    a.close()
    b.close()


def test_a_buffering_outbox_keeps_what_the_socket_does_not_take_without_copying_or_blocking():
    from refork.serving.outbox import Outbox

    a, b = socket.socketpair()
    a.setblocking(False)
    out = Outbox(a, None, 0.2, Control(), buffering=True)
    big = b"x" * 20_000_000
    out.send(big)  # returns at once
    assert out.backlogged
    assert out.queue[0].obj is big  # a view of the app's bytes
    out.send(b"tail")
    assert len(out.queue) == 2
    b.setblocking(False)
    received = 0
    while not out.write_some():
        try:
            received += len(b.recv(1 << 20))
        except BlockingIOError:
            pass
    while True:
        try:
            data = b.recv(1 << 20)
        except BlockingIOError:
            break
        received += len(data)
    assert received == len(big) + 4 and not out.backlogged
    a.close()
    b.close()


def test_a_request_that_arrives_while_a_safe_point_waits_is_served_after_it():
    """The worker wants a safe point while a request is in the app: a request that arrives then is
    held (not given to a free app thread) and served once the safe point is over."""
    lsock = tcp_listener()
    control, thread, outcome = serve_in_thread([lsock], threads=2)
    try:
        port = lsock.getsockname()[1]
        busy = socket.create_connection(("127.0.0.1", port), timeout=10)
        busy.sendall(b"GET /slow?s=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: STATS["active"] == 1, what="the request in the app")
        control.wake(safe_point_wanted=True)
        wait_until(lambda: control.wakes, what="the loop to see the wake")
        late = socket.create_connection(("127.0.0.1", port), timeout=10)
        late.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert Reader(late).response()[2] == b"root"
        answered = time.monotonic()
        assert Reader(busy).response()[2] == b"slept"
        assert len(control.safe_points_at) == 1 and control.safe_points_at[0] < answered
        assert not [n for n in control.safe_point_tasks[0] if n.startswith("refork-")]
        late.close()
        busy.close()
    finally:
        control.wake(exit_now=True)
        thread.join(10)
        lsock.close()
    assert outcome == [None]
