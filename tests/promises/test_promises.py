"""The promises, each one test run on every request path that serves it (and, by ./scripts/test,
on every supported interpreter): a hung request costs only itself, a slow client only its
connection, a killed worker or mold is replaced with nothing else lost, a refork, a reload and
recycling lose nothing, and a prepared heap keeps computing right.

A new request path is one more entry in request_paths.PATHS; a new promise is one more test here.
On the HTTP/2 paths (h2c, and h2 over TLS) the clients speak HTTP/2: the load, the hung requests, the
slow clients are streams; a promise about HTTP/1.1 framing has its HTTP/2 counterpart there.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager

import h2.exceptions
import pytest
from conftest import Server, pids_alive, read_to_end
from h2.settings import SettingCodes
from hyperframe.frame import GoAwayFrame
from support import h2client
from support.h2client import H2Client, Refused
from support.load import Load
from support.request_paths import PATHS, every_path, flags, http2, threads, tls, wsgi_paths

from refork.memory.heap import immortalize_support

CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def serve(start_server: Callable[..., Server], path: str, *args: str, workers: int = 2, **kw) -> Server:
    chosen, app = flags(path, "apps.promises")
    return start_server(*chosen, *args, app=app, workers=workers, defaults=True, **kw)


def get(server: Server, path: str, url: str = "/", timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of a GET on a new connection, in the path's protocol."""
    if http2(path):
        return h2client.get(server.port, url, timeout, tls(path))
    return server.get(url, timeout=timeout)


def load_for(server: Server, path: str, threads: int) -> Load:
    """Load in the path's protocol."""
    return Load(server.port, threads=threads, http2=http2(path), tls=tls(path))


def hang(server: Server, path: str, url: str = "/hang") -> closing[socket.socket] | closing[H2Client]:
    """A request left waiting on a connection of its own (a stream on HTTP/2 paths), until closed."""
    if http2(path):
        client = H2Client(server.port, tls=tls(path))
        client.send("GET", url)
        return closing(client)
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return closing(s)


class Hung:
    """Clients that keep a request to /hang open, each sending another when its connection dies;
    on an HTTP/2 path each connection holds `streams` hung streams."""

    def __init__(self, port: int, path: str, clients: int, streams: int = 4) -> None:
        self.port = port
        self.h2 = http2(path)
        self.tls = tls(path)
        self.streams = streams if self.h2 else 1
        self.stop = threading.Event()
        self.sent = 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Hung:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(10)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                with self._hung() as read:
                    while not self.stop.is_set():
                        try:
                            if not read():
                                break  # its worker was replaced: hang more
                        except TimeoutError:
                            continue
            except (OSError, h2.exceptions.ProtocolError):
                time.sleep(0.05)

    @contextmanager
    def _hung(self) -> Iterator[Callable[[], object]]:
        """A connection with its hung requests sent; what reads it (falsy once it is closed)."""
        if self.h2:
            with closing(H2Client(self.port, timeout=0.5, tls=self.tls)) as client:
                for _ in range(self.streams):
                    client.send("GET", "/hang")
                    self.sent += 1
                yield client.read
        else:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
                self.sent += 1
                yield lambda: s.recv(100)


# -- a hung request costs only itself --------------------------------------------------------------
@every_path
def test_a_flood_of_hung_requests_costs_only_those_requests(start_server, path):
    """Hung requests on more than half of the app threads (a worker holding one is killed at
    --timeout and replaced): the other requests are served, >= 95% of them."""
    per_worker = threads(path)
    workers = 4 if per_worker == 1 else 2
    hung = max(2, workers * per_worker * 5 // 8) if per_worker else 20
    server = serve(start_server, path, "--timeout", "2", "--graceful-timeout", "3", workers=workers)
    # On a thread path each hung stream holds a thread: one a connection, so that `hung` is what
    # hangs (four a connection would hang every thread of both workers on an HTTP/2 path).
    with Hung(server.port, path, hung, streams=1 if per_worker else 4) as flood:
        server.wait_for(lambda: flood.sent >= hung, what=f"{hung} hung requests")
        with load_for(server, path, threads=4) as load:
            load.wait_for_requests(300, timeout=30)
            if PATHS[path][0] == "wsgi":  # the load goes on across a --timeout kill and its replacement
                server.wait_for(lambda: re.search("(aborting|draining) it", server.log()),
                                what="a --timeout kill (under --threads: its drain)")
            load.wait_for_requests(300, timeout=30)
    served = load.ok / max(1, load.ok + len(load.failures))
    assert load.ok >= 300 and served >= 0.95, (load.ok, load.failures[:5], server.log()[-3000:])
    # a request that was on a killed worker's other thread is among the failures counted above
    server.wait_for(lambda: get(server, path)[0] == 200, what="a request served once the flood ends")
    if PATHS[path][0] == "asgi":  # an awaiting request holds no thread: its worker is never killed for it
        log = server.log()
        assert "busy longer than" not in log and load.failures == [], (load.failures[:5], log[-3000:])


@wsgi_paths
def test_a_worker_whose_app_threads_are_all_busy_accepts_nothing_it_cannot_start(start_server, path):
    """With one worker's app threads all hung, new connections go to the worker that can serve
    them: none waits behind the hung requests (they would be lost when --timeout kills it)."""
    per_worker = threads(path)
    server = serve(start_server, path, "--timeout", "60", workers=2)
    full = None
    with ExitStack() as hung_requests:
        total = 0
        while full is None and total < 2 * per_worker - 1:
            hung_requests.enter_context(hang(server, path))
            total += 1
            busy = server.wait_for(
                lambda total=total: (b := [w["busy"] for w in server.workers()]) and sum(b) == total and b,
                what=f"{total} hung requests in the app",
            )
            full = next((i for i, b in enumerate(busy) if b == per_worker), None)
        assert full is not None, "no worker got all its threads hung"
        free = [w["pid"] for w in server.workers() if w["busy"] < per_worker]
        for _ in range(40):  # each on a new connection: the kernel offers it to both workers
            try:
                code, body = get(server, path, timeout=5)
            except TimeoutError:
                raise AssertionError(f"a GET waited 5 s: {server.workers()}\n{server.log()}") from None
            assert code == 200 and int(body.split()[0]) in free


@pytest.mark.parametrize("path", [p for p in PATHS if threads(p) != 1])  # (one thread: nothing serves beside)
def test_a_refork_asked_while_a_request_hangs_holds_nothing_behind_it(start_server, path):
    """The only worker, told to become a mold while a request hangs in its app, finds no safe point:
    it declines within about a second and serves on (new requests wait at most that long), and the
    mold it was to fork is forgotten, so a reload goes ahead."""
    server = serve(start_server, path, "--refork-after", "off", "--graceful-timeout", "1", workers=1)
    with hang(server, path):
        server.wait_for(lambda: server.workers()[0]["busy"] == 1, what="the hung request in the app")
        server.signal(signal.SIGUSR2)
        server.wait_for(lambda: "promoting worker 0" in server.log(), what="the promotion asked")
        assert get(server, path, timeout=10)[0] == 200
        server.wait_for(lambda: "not promoted to mold of gen 1" in server.log(), what="the decline")
        server.signal(signal.SIGHUP)
        server.wait_for(lambda: server.one_generation(1) == 1, timeout=30, what="the reload")


@every_path
def test_a_refork_under_overlapping_requests_is_taken_not_declined(start_server, path):
    """Requests that always overlap (4 clients of 0.3 s requests, one worker) leave no moment
    without one in flight: a worker asked to become a mold holds the new ones (HTTP/2: new streams)
    until those in flight end, and is promoted; nothing fails."""
    server = serve(start_server, path, "--refork-after", "off", workers=1)
    with Load(server.port, "/sleep?0.3", threads=4, http2=http2(path), tls=tls(path)) as load:
        load.wait_for_requests(8)
        server.signal(signal.SIGUSR2)
        server.wait_for(lambda: "promoted to mold of gen 1" in server.log(), what="the promotion's outcome")
    assert "not promoted" not in server.log(), server.log()
    assert load.failures == []


def answer(client: socket.socket | H2Client) -> tuple[int, bytes]:
    """(status, body) of the one request sent on `client` (hang()'s); (0, what came) if it was
    closed without a whole answer."""
    if isinstance(client, H2Client):
        try:
            return client.response(1)
        except ConnectionError:
            return 0, b""
    client.settimeout(30)
    data = read_to_end(client)
    head, _, body = data.partition(b"\r\n\r\n")
    length = CONTENT_LENGTH.search(head + b"\r\n")
    if not head.startswith(b"HTTP/1.1 ") or length is None or len(body) != int(length.group(1)):
        return 0, data
    return int(head[9:12]), body


@every_path
def test_a_request_blocked_in_the_app_past_timeout_gets_a_500_and_its_worker_is_replaced(start_server, path):
    """As in gunicorn: past --timeout the worker is aborted (SIGABRT, SIGKILL a second later), the
    request blocked in the app gets a 500 (its response had not started), a replacement serves.
    Under --threads the worker drains first (--graceful-timeout), then answers it as it exits."""
    server = serve(start_server, path, "--timeout", "1", "--graceful-timeout", "1", workers=1)
    before = server.workers()[0]["pid"]
    blocking = "/block?30" if PATHS[path][0] == "asgi" else "/sleep?30"
    with hang(server, path, blocking) as client:
        status, body = answer(client)
        server.wait_for(lambda: (w := server.workers()) and w[0]["pid"] != before, what="a replacement")
    drained = threads(path) > 1  # (its other threads' requests first: see the test below)
    assert f"busy longer than 1s; {'draining' if drained else 'aborting'} it" in server.log()
    assert (status, bool(body)) == (500, True), (status, body, server.log()[-3000:])
    assert get(server, path)[0] == 200


@every_path
def test_a_request_past_timeout_whose_response_started_is_cut_with_no_500_after_it(start_server, path):
    """Its head and part of its body are out: the connection is closed (HTTP/2: the stream reset),
    nothing is appended to what the client already has."""
    server = serve(start_server, path, "--timeout", "1", "--graceful-timeout", "1", workers=1)
    before = server.workers()[0]["pid"]
    with hang(server, path, "/started?30") as client:
        status, data = answer(client)
        server.wait_for(lambda: (w := server.workers()) and w[0]["pid"] != before, what="a replacement")
    assert status == 0 and b" 500 " not in data, data
    if not http2(path):
        assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"\r\n\r\nhalf"), data
    assert get(server, path)[0] == 200


@pytest.mark.parametrize("path", [p for p in PATHS if threads(p) > 1])
def test_a_request_hung_past_timeout_under_threads_costs_only_itself(start_server, path):
    """The worker's loop is not the stuck thread: past --timeout it stops accepting (a replacement
    serves at once), the requests in its other threads finish within --graceful-timeout, and then
    it is killed."""
    server = serve(start_server, path, "--timeout", "2", "--graceful-timeout", "5", workers=1)
    before = server.workers()[0]["pid"]
    answers: list[tuple[int, bytes] | Exception] = []

    def sleep() -> None:
        try:
            answers.append(get(server, path, "/sleep?3", timeout=20))
        except Exception as e:
            answers.append(e)

    with hang(server, path):
        server.wait_for(lambda: server.workers()[0]["busy"] == 1, what="the hung request in the app")
        sleepers = [threading.Thread(target=sleep) for _ in range(2)]
        for t in sleepers:
            t.start()
        server.wait_for(lambda: "draining it" in server.log(), what="the hung worker draining")
        for t in sleepers:
            t.join(30)
        assert answers == [(200, b"slept")] * 2, server.log()
        server.wait_for(lambda: not pids_alive([before]), what="the drained worker killed")
    assert "drained for --graceful-timeout 5s; aborting it" in server.log()
    assert get(server, path)[0] == 200


# -- a slow client costs only its connection -------------------------------------------------------
def never_reads(server: Server, path: str) -> closing[socket.socket] | closing[H2Client]:
    """A GET of 50 MB whose client never reads (over HTTP/2: never opens its stream's window)."""
    if http2(path):
        client = H2Client(server.port, settings={SettingCodes.INITIAL_WINDOW_SIZE: 0}, tls=tls(path))
        client.send("GET", "/big?50000000")
        return closing(client)
    reader = socket.create_connection(("127.0.0.1", server.port))
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.sendall(b"GET /big?50000000 HTTP/1.1\r\nHost: x\r\n\r\n")
    return closing(reader)


def slowloris(server: Server, path: str) -> socket.socket:
    """A head that never ends (over HTTP/2: HEADERS without END_HEADERS, no CONTINUATION)."""
    if http2(path):
        return h2client.unfinished_head(server.port, tls=tls(path))
    loris = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    loris.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    return loris


def cut_off(loris: socket.socket, path: str) -> bool:
    """The slowloris was answered at --header-timeout: 408 (HTTP/2: GOAWAY, then the close)."""
    if http2(path):
        return any(isinstance(f, GoAwayFrame) for f in h2client.frames(read_to_end(loris)))
    return loris.recv(100).startswith(b"HTTP/1.1 408")


@every_path
def test_a_client_that_never_reads_and_a_slowloris_cost_only_their_connections(start_server, path):
    server = serve(start_server, path, "--write-timeout", "2", "--header-timeout", "2", workers=1)
    with never_reads(server, path), closing(slowloris(server, path)) as loris:
        with load_for(server, path, threads=2) as load:
            load.wait_for_requests(100)
        assert load.failures == [] and load.ok >= 100
        assert cut_off(loris, path)
        server.wait_for(lambda: "write timeout" in server.log(), what="the non-reader cut")
    assert get(server, path)[0] == 200


# -- every response answers its own request -------------------------------------------------------
@every_path
@pytest.mark.parametrize("status", [100, 103])
def test_an_app_answering_an_interim_status_as_its_response_gets_a_500_and_nothing_is_mispaired(
    start_server, path, status
):
    """A 1xx is interim (RFC 9110 15.2): sent as the response, the client would take the next
    response for this request's. The app's bug is a 500 (the connection then closes), and the
    request pipelined behind it is never answered as if it were the first's (over HTTP/2: a 500 on
    its stream, and the stream opened beside it gets its own answer)."""
    server = serve(start_server, path, workers=1)
    if http2(path):
        with closing(H2Client(server.port, timeout=10, tls=tls(path))) as client:
            interim, beside = client.send("GET", f"/status?{status}"), client.send("GET", "/")
            assert client.response(interim)[0] == 500
            code, body = client.response(beside)
        assert code == 200 and int(body.split()[0]) == server.workers()[0]["pid"]
        assert "informational" in server.log().lower(), server.log()[-2000:]
        return
    pipelined = f"GET /status?{status} HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(pipelined.encode())
        data = read_to_end(s)
    assert data.startswith(b"HTTP/1.1 500 ") and data.count(b"HTTP/1.1 ") == 1, data[:300]
    assert "informational" in server.log().lower(), server.log()[-2000:]
    assert server.get("/")[0] == 200


# -- a dead process is replaced, nothing else lost ------------------------------------------------
@every_path
def test_a_worker_killed_under_load_is_replaced_from_the_mold_losing_only_its_own_requests(
    start_server, path
):
    server = serve(start_server, path, workers=2)
    with load_for(server, path, threads=4) as load:
        load.wait_until_warm()
        victim = server.workers()[0]
        os.kill(victim["pid"], signal.SIGKILL)
        server.wait_for(
            lambda: len([w for w in server.workers() if w["pid"] != victim["pid"]]) == 2,
            timeout=10,
            what="a replacement",
        )
        load.wait_for_requests(100)
    assert len(load.failures) <= 4, load.failures  # at most one in flight per client on the victim
    assert "fresh import" not in server.log()  # forked warm: from the mold, or a promoted worker


@every_path
def test_a_killed_mold_is_recovered_and_forks_again(start_server, path):
    server = serve(start_server, path, "--mold-idle-exit", "off", "--refork-after", "off", workers=2)
    mold = server.mold()
    workers = {w["pid"] for w in server.workers()}
    with load_for(server, path, threads=2) as load:
        os.kill(mold["pid"], signal.SIGKILL)
        server.wait_for(lambda: (m := server.mold()) and m["pid"] != mold["pid"], what="a new mold")
        assert {w["pid"] for w in server.workers()} == workers  # they kept serving
        victim = server.workers()[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        server.wait_for(
            lambda: len([w for w in server.workers() if w["pid"] != victim]) == 2, what="a fork from it"
        )
        load.wait_for_requests(50)
    assert len(load.failures) <= 2, load.failures


# -- refork, reload and recycling lose nothing ----------------------------------------------------
@every_path
def test_a_refork_under_load_loses_nothing(start_server, path):
    server = serve(start_server, path, workers=2)
    with load_for(server, path, threads=4) as load:
        load.wait_for_requests(50)
        before = server.status()["generation"]
        server.signal(signal.SIGUSR2)  # (or one the policy started meanwhile: a refork all the same)
        server.wait_for(lambda: (server.one_generation(2) or 0) > before, what="a new generation everywhere")
        load.wait_for_requests(50)
    assert load.failures == []


@every_path
def test_the_default_refork_policy_under_load_loses_nothing(start_server, path):
    """With no flags, workers are promoted after 50 and then 100 requests: two reforks in a row
    while clients keep sending."""
    server = serve(start_server, path, workers=2)
    with load_for(server, path, threads=4) as load:
        server.wait_for(lambda: (server.one_generation(2) or 0) >= 2, timeout=60,
                        what="two reforks by the default policy")  # fmt: skip
        load.wait_for_requests(50)
    assert load.failures == []
    assert server.log().count("promoting worker") >= 2


@every_path
def test_a_reload_under_load_loses_nothing(start_server, path):
    server = serve(start_server, path, "--refork-after", "off", workers=2)
    old = {w["pid"] for w in server.workers()}
    with load_for(server, path, threads=4) as load:
        load.wait_for_requests(50)
        server.signal(signal.SIGHUP)
        server.wait_for(lambda: server.one_generation(2) == 1, timeout=30, what="generation 1 everywhere")
        load.wait_for_requests(50)
    assert load.failures == []
    assert not old & {w["pid"] for w in server.workers()}
    assert "starting a new mold from a fresh import" not in server.log()


@every_path
def test_max_requests_recycling_under_load_loses_nothing(start_server, path):
    server = serve(start_server, path, "--max-requests", "40", workers=2)
    first = {w["pid"] for w in server.workers()}
    with load_for(server, path, threads=3) as load:
        server.wait_for(lambda: len(load.pids) >= 6, timeout=30, what="three rounds of recycled workers")
    assert load.failures == []
    assert not first & {w["pid"] for w in server.workers()}


def pipelined_bodies(port: int, request: bytes, total: int, depth: int = 50) -> Iterator[bytes]:
    """The bodies of `total` responses to `request`, sent `depth` at a time on a keep-alive
    connection; when the server closes it (a worker retired by a refork), the rest go on a new one."""
    count = 0
    while count < total:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            buffer = [b""]
            open_ = True
            while open_ and count < total:
                s.sendall(request * depth)
                for _ in range(depth):
                    body = next_body(s, buffer)
                    if body is None:
                        open_ = False  # what was not answered goes again on a new connection
                        break
                    count += 1
                    yield body


def multiplexed_bodies(port: int, url: str, total: int, depth: int = 50, tls: ssl.SSLContext | None = None
                       ) -> Iterator[bytes]:  # fmt: skip
    """The bodies of `total` GETs of `url` over HTTP/2, `depth` streams at a time on a connection;
    those the server did not process (a GOAWAY below them: a worker retired) go on a new one."""
    count = 0
    while count < total:
        with closing(H2Client(port, timeout=10, tls=tls)) as client:
            while client.usable and count < total:
                for sid in [client.send("GET", url) for _ in range(min(depth, total - count))]:
                    try:
                        _, body = client.response(sid)
                    except Refused:
                        continue  # (the rest of this round too: the next round is on a new connection)
                    count += 1
                    yield body


def next_body(s: socket.socket, buffer: list[bytes]) -> bytes | None:
    """The next response's body from `s` (Content-Length framed), or None when `s` is closed first."""
    while True:
        head, sep, rest = buffer[0].partition(b"\r\n\r\n")
        match = CONTENT_LENGTH.search(head) if sep else None
        if match and len(rest) >= int(match.group(1)):
            length = int(match.group(1))
            buffer[0] = rest[length:]
            return rest[:length]
        try:
            data = s.recv(65536)
        except ConnectionResetError:  # closed with requests of ours unread: they go again
            return None
        if not data:
            return None
        buffer[0] += data

# -- the prepared heap ----------------------------------------------------------------------------
@every_path
def test_a_prepared_heap_serves_a_call_heavy_app_right_for_10k_requests(start_server, path):
    from apps.heavy import EXPECTED

    server = serve(start_server, path, workers=2)
    supported, why = immortalize_support()
    heap = server.log()
    assert ("immortalize on (" in heap) if supported else (f"immortalize unsupported: {why}" in heap), heap
    expected = str(EXPECTED).encode()
    if http2(path):
        bodies = list(multiplexed_bodies(server.port, "/calls", 10_000, tls=tls(path)))
    else:
        bodies = list(pipelined_bodies(server.port, b"GET /calls HTTP/1.1\r\nHost: x\r\n\r\n", 10_000))
    wrong = [body for body in bodies if body != expected]
    assert wrong == []
    assert server.proc.poll() is None and len(server.workers()) == 2
    assert "was killed by" not in server.log()


# -- a dead monitor leaves nothing behind ------------------------------------------------------
def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@every_path
def test_a_worker_whose_monitor_died_frees_the_port_finishes_quietly_and_exits(start_server, path):
    """With a request hung in it: the port is free at once (a restarted server can bind), it
    says so once, spins on nothing, and is gone within --graceful-timeout."""
    from conftest import pids_alive

    server = serve(start_server, path, "--graceful-timeout", "3", workers=1)
    worker = server.workers()[0]["pid"]
    with hang(server, path):
        server.wait_for(lambda: server.workers()[0]["busy"] == 1, what="the hung request in the app")
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        died = time.monotonic()

        def port_free() -> bool:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", server.port))
                    s.listen()
                except OSError:
                    return False
                return True

        deadline = died + 5
        while not port_free():
            assert time.monotonic() < deadline, "the orphan kept the listening socket"
            time.sleep(0.05)
        before = cpu_ticks(worker)
        while time.monotonic() < died + 1.5:
            assert pids_alive([worker]), "exited before --graceful-timeout with a request in flight"
            time.sleep(0.1)
        assert cpu_ticks(worker) - before < 30, "the orphan spins"
        while pids_alive([worker]):
            assert time.monotonic() < died + 3 + 5, "the orphan outlived --graceful-timeout"
            time.sleep(0.1)
    assert server.log().count("the monitor is gone") == 1, server.log()[-2000:]
