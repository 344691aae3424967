"""The native engines (`--wsgi-loop native`): refork._native.Engine with one app thread, and
PoolEngine with a pool of them (`--threads 4` here); what is specific to them, over real sockets
against a real server.

Each engine serves the common request shape itself and hands everything else to the Python loop,
from the first byte of the message (a request) or mid-response (a response that is not a list
body). These tests cross that line on one connection, in both directions, and check what only
the engines do: a list response the client does not read waits in the engine's buffer (other
clients are served meanwhile, pipelined requests wait behind it, the write timeout cuts it).
What only the pool engine does (its I/O thread needs no app thread and no GIL) is at the end.
The rest of their contract is the Python loop's, checked by the WSGI, HTTP and process suites
that run on both loops.
"""

from __future__ import annotations

import http.client
import io
import socket
import time
from typing import Any

import pytest
from fuzz.grammar import CORPUS, fuzzed
from hypothesis import given, settings
from support.waits import sender_blocked, sleeping_threads, wait_until

APP = "apps.engine_apps:app"


class _Reader(io.BufferedReader):
    """A socket's one buffered reader that a finished response does not close."""

    def close(self) -> None:
        pass


class _File:
    """What http.client.HTTPResponse takes for a socket: its makefile() is the one reader."""

    def __init__(self, sock: socket.socket) -> None:
        self.f = _Reader(socket.SocketIO(sock, "rb"))

    def makefile(self, *args: Any, **kwargs: Any) -> Any:
        return self.f


def responses(sock: socket.socket, methods: list[str]) -> list[tuple[int, bytes, str | None]]:
    """Read one response per request method, in order: (status, body, Connection header)."""
    reader = _File(sock)
    out = []
    for method in methods:
        resp = http.client.HTTPResponse(reader, method=method)  # type: ignore[arg-type]
        resp.begin()
        out.append((resp.status, resp.read(), resp.getheader("Connection")))
    return out


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def get(path: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: t\r\n{extra}\r\n".encode()


def closed_by(server: Any, count: int) -> list[bytes]:
    """Who called the close() of the last `count` sized iterable bodies (tests/apps/engine_apps.py):
    the Python response path calls it once the response is out, so it may come a little after."""
    callers: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(callers) < count and time.monotonic() < deadline:
        status, body = server.get("/closed")
        assert status == 200
        callers += [c for c in body.split(b",") if c]
        if len(callers) < count:
            time.sleep(0.02)
    assert len(callers) == count, callers
    return callers


ENGINES = pytest.mark.parametrize("threads", [1, 4], ids=["engine", "pool"])


def native(start_server: Any, threads: int, *args: str) -> Any:
    """A server whose worker runs the engine (threads 1) or the pool engine."""
    server = start_server("--wsgi-loop", "native", "--threads", str(threads), *args, app=APP, workers=1)
    assert f"WSGI loop: native (engine{f', {threads} app threads' if threads > 1 else ''})" in server.log()
    return server


@pytest.fixture(params=[1, 4], ids=["engine", "pool"])
def engine(start_server, request):
    return native(start_server, request.param)


def test_one_connection_crosses_between_the_engine_and_the_python_loop(engine) -> None:
    """Pipelined: fast requests, a chunked body (the Python parser's), responses of every shape;
    all answered in order on one connection."""
    chunked = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    sized = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"
    wire = [get("/a?x=1"), sized, chunked, get("/b"), get("/gen"), get("/write"), get("/file"), get("/c")]
    with connect(engine.port) as sock:
        sock.sendall(b"".join(wire))
        got = responses(sock, ["GET", "POST", "POST", "GET", "GET", "GET", "GET", "GET"])
    bodies = [body for _, body, _ in got]
    assert [status for status, _, _ in got] == [200] * 8
    assert bodies[:5] == [b"GET /a?x=1 -", b"echo:hello", b"echo:abc", b"GET /b? -", b"g1g2"]
    assert bodies[5:] == [b"writte", b"f" * 100_000, b"GET /c? -"]


def test_a_head_and_a_body_in_pieces_are_served(engine) -> None:
    with connect(engine.port) as sock:
        pieces = (b"POST /echo HTTP/1.1\r\nHo", b"st: t\r\nContent-Le", b"ngth: 6\r\n\r\nab", b"cd", b"ef")
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(0.05)  # (the input, not a wait) the pieces arrive apart
        sock.sendall(get("/after"))
        got = responses(sock, ["POST", "GET"])
    assert got[0][:2] == (200, b"echo:abcdef")
    assert got[1][:2] == (200, b"GET /after? -")


@pytest.mark.parametrize("path", ["/boom", "/late", "/bad-status", "/twice"])
def test_an_app_error_is_a_500_and_the_connection_closes(engine, path: str) -> None:
    with connect(engine.port) as sock:
        sock.sendall(get(path) + get("/never"))
        [(status, _, connection)] = responses(sock, ["GET"])
        assert status == 500 and connection == "close"
        assert sock.recv(100) == b""
    engine.wait_for(lambda: f"Error in WSGI app: GET {path}" in engine.log(), what="the error logged")
    status, body = engine.get("/still-serving")
    assert (status, body) == (200, b"GET /still-serving? -")


def test_a_sized_body_that_is_not_a_list_is_framed_by_the_engine_and_closed(engine) -> None:
    """Django's HttpResponse and werkzeug's ClosingIterator are iterables with close() and a
    Content-Length: the engine pulls and frames them (close() is called by it, not by the Python
    response path's _close); anything else of that kind is the Python path's, with what was pulled
    first."""
    with connect(engine.port) as sock:
        sock.sendall(get("/iterable") * 2)
        got = responses(sock, ["GET", "GET"])
    assert [r[:2] for r in got] == [(200, b"iterable")] * 2
    with connect(engine.port) as sock:  # fewer bytes than its Content-Length: closed after them
        sock.sendall(get("/iterable-short") + get("/never"))
        wire = b""
        while chunk := sock.recv(1 << 16):
            wire += chunk
    assert wire.startswith(b"HTTP/1.1 200 ") and b"Content-Length: 9\r\n" in wire
    assert wire.endswith(b"\r\n\r\nshort")
    assert b"_close" not in closed_by(engine, 3)  # called by the engine
    with connect(engine.port) as sock:
        sock.sendall(get("/iterable-close-raises") + get("/never"))
        [(status, body, _)] = responses(sock, ["GET"])
        assert (status, body) == (200, b"closing")  # sent; then the connection closes
        assert sock.recv(10) == b""
    with connect(engine.port) as sock:
        sock.sendall(get("/iterable-stream"))
        assert responses(sock, ["GET"])[0][:2] == (200, b"s1s2")  # a stream: the Python path, chunked
    callers = closed_by(engine, 2)
    assert callers[0] != b"_close" and callers[1] == b"_close"  # the stream's by the Python path
    line = "Error in WSGI app after the response head was sent: GET /iterable-close-raises"
    engine.wait_for(lambda: line in engine.log(), what="the close() error logged")


def test_a_connection_the_python_loop_served_goes_back_to_the_engine(engine) -> None:
    """A response the engine does not frame (a stream), a chunked upload (the Python parser's) and a
    health check go through the Python loop; the keep-alive connection then comes back to the
    engine, which frames the next sized iterable itself (its close() not called by _close)."""
    chunked = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    firsts = [(get("/iterable-stream"), "GET", b"s1s2"), (chunked, "POST", b"echo:abc")]
    with connect(engine.port) as sock:
        for raw, method, body in firsts * 2:
            sock.sendall(raw)
            assert responses(sock, [method])[0][:2] == (200, body)
            sock.sendall(get("/iterable"))
            assert responses(sock, ["GET"])[0][:2] == (200, b"iterable")
    callers = closed_by(engine, 6)
    assert callers[0::3] == [b"_close", b"_close"]  # the streams, by the Python path
    assert b"_close" not in callers[1::3] + callers[2::3]  # the iterables, by the engine


def test_a_request_through_a_proxy_is_served_by_the_engine(engine) -> None:
    """Behind nginx or a load balancer every request has X-Forwarded-* fields: the engine serves it
    (the trusted-proxy rules applied to its native environ), not the Python loop."""
    proxied = "X-Forwarded-For: 203.0.113.7\r\nX-Forwarded-Proto: https\r\n"
    with connect(engine.port) as sock:
        sock.sendall(get("/iterable", proxied) + get("/", proxied))
        got = responses(sock, ["GET", "GET"])
    assert got[0][:2] == (200, b"iterable") and got[1][:2] == (200, b"GET /? -")
    assert closed_by(engine, 1) != [b"_close"]


@pytest.mark.parametrize("kept", ["start", "environ", "write"])
def test_what_an_app_keeps_of_a_request_is_never_given_to_another(engine, kept: str) -> None:
    """The engine gives a request's start_response and wsgi.early_hints to the next one only
    when nothing else holds them (wsgi/app_call.rs `recycle`)."""
    for _ in range(3):
        assert engine.get("/x")[0] == 200
        assert engine.get(f"/keep?{kept}") == (200, b"fresh")


@pytest.mark.parametrize("path", ["/iterable-long", "/iterable-str", "/iterable-raises"])
def test_a_sized_body_the_engine_cannot_frame_gets_the_python_loops_answer(start_server, path: str) -> None:
    for threads in (1, 4):
        engine, python = _pair(start_server, threads)
        ours, theirs = _answers(engine.port, get(path)), _answers(python.port, get(path))
        assert ours == theirs and ours, (threads, ours, theirs)


def test_exc_info_replaces_the_status_before_anything_is_sent(engine) -> None:
    status, body = engine.get("/replaced")
    assert (status, body) == (503, b"sorry")


def test_a_client_that_does_not_read_costs_only_its_own_connection(engine) -> None:
    """A list response the socket does not take waits in the engine (EPOLLOUT); the pipelined
    request behind it waits for it; other clients are served meanwhile."""
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", engine.port))
    try:
        slow.sendall(get("/big?60000") * 100 + get("/last"))  # more than the kernel buffers hold
        # the server's send buffer fills; it must not wait for this client
        wait_until(lambda: sender_blocked(slow), what="the server blocked on the unread socket")
        t0 = time.monotonic()
        for _ in range(5):
            assert engine.get("/other") == (200, b"GET /other? -")
        assert time.monotonic() - t0 < 5
        slow.settimeout(10)
        got = responses(slow, ["GET"] * 101)
    finally:
        slow.close()
    assert [body for _, body, _ in got[:100]] == [b"b" * 60000] * 100
    assert got[100][:2] == (200, b"GET /last? -")


def test_the_engine_sends_a_sized_file_itself_and_closes_it(start_server) -> None:
    """A wsgi.file_wrapper with its Content-Length on a plain connection: the engine writes the head
    and the file (sendfile) itself, pipelined requests go on behind it, and the wrapper's close()
    is its call, not the Python response path's (_close)."""
    server = native(start_server, 1)
    with connect(server.port) as sock:
        sock.sendall(get("/file-sized") + get("/file-sized?5") + get("/c"))
        got = responses(sock, ["GET"] * 3)
    assert [r[:2] for r in got] == [(200, b"s" * 100_000), (200, b"sssss"), (200, b"GET /c? -")]
    assert b"_close" not in closed_by(server, 2)


def test_a_slow_reader_of_a_big_file_holds_nobody_and_gets_all_of_it(engine) -> None:
    """The file part waits with the connection (EPOLLOUT) when the socket is full; other clients
    are served meanwhile, and the request pipelined behind it is answered once the file is out."""
    size = 8 << 20
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.connect(("127.0.0.1", engine.port))
    try:
        slow.sendall(get(f"/file-sized?{size}") + get("/last"))
        wait_until(lambda: sender_blocked(slow), what="the server blocked on the unread socket")
        for _ in range(5):
            assert engine.get("/other") == (200, b"GET /other? -")
        slow.settimeout(10)
        got = responses(slow, ["GET", "GET"])
    finally:
        slow.close()
    assert got[0][:2] == (200, b"s" * size) and got[1][:2] == (200, b"GET /last? -")


@ENGINES
@pytest.mark.parametrize(("wire", "what"), [
    (get("/big?60000") * 200, "GET /big?60000"),  # more than the kernel buffers hold
    (get(f"/file-sized?{50 << 20}"), f"GET /file-sized?{50 << 20}"),
], ids=["list", "file"])  # fmt: skip
def test_the_write_timeout_cuts_a_client_that_stopped_reading(
    start_server, threads: int, wire: bytes, what: str
) -> None:
    server = native(start_server, threads, "--write-timeout", "1")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.port))
    try:
        sock.sendall(wire)
        server.wait_for(lambda: "write timeout" in server.log(), timeout=10, what="the write timeout")
        line = next(line for line in server.log().splitlines() if "write timeout" in line)
        assert "WARNING" in line and f"stopped reading {what} for 1.0 s" in line
        sock.settimeout(10)
        total = 0
        while chunk := sock.recv(1 << 16):  # what was sent before the cut, then EOF
            total += len(chunk)
        assert total < 200 * 60000
    finally:
        sock.close()
    assert server.get("/") == (200, b"GET /? -")


@ENGINES
def test_out_of_descriptors_the_engine_pauses_accepts_then_serves_again(start_server, threads, tmp_path):
    """accept() failing for want of descriptors (EMFILE) is logged once a second, not spun on; the
    clients queued meanwhile are served once descriptors are free again."""
    conf = tmp_path / "few_fds.py"
    conf.write_text(
        "import resource\n"
        "def post_fork(server, worker):\n"
        "    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "    resource.setrlimit(resource.RLIMIT_NOFILE, (40, hard))\n"
    )
    server = native(start_server, threads, "-c", str(conf))
    held = []
    try:
        for _ in range(40):  # more than the worker can accept
            sock = connect(server.port)
            sock.sendall(get("/held"))
            held.append(sock)
        server.wait_for(lambda: "pausing accepts for a second" in server.log(), what="the pause")
        for sock in held:
            sock.settimeout(10)
        got = [responses(sock, ["GET"])[0][:2] for sock in held[:5]]  # served before the pause
        assert got == [(200, b"GET /held? -")] * 5
    finally:
        for sock in held:
            sock.close()  # descriptors free again: the queued clients get theirs
    assert server.get("/after") == (200, b"GET /after? -")
    assert server.log().count("accept() failed") <= 15  # once a second at most, not a spin


@ENGINES
def test_the_access_log_has_every_request_whichever_loop_served_it(start_server, threads: int) -> None:
    server = native(start_server, threads, "--access-logfile", "-")
    with connect(server.port) as sock:
        sized = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\nhi"
        sock.sendall(get("/fast") + sized + get("/gen"))
        assert [s for s, _, _ in responses(sock, ["GET", "POST", "GET"])] == [200, 200, 200]
    for line in ('"GET /fast HTTP/1.1" 200 12', '"POST /echo HTTP/1.1" 200 7', '"GET /gen HTTP/1.1" 200 4'):
        server.wait_for(lambda line=line: line in server.log(), what=f"access line {line}")


def test_a_malformed_request_after_a_served_one_gets_its_4xx(engine) -> None:
    with connect(engine.port) as sock:
        sock.sendall(get("/ok") + b"GET /bad HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n")
        got = responses(sock, ["GET", "GET"])
    assert got[0][:2] == (200, b"GET /ok? -")
    assert got[1][0] == 400


def _answers(port: int, raw: bytes) -> list[bytes]:
    """The status lines a server sends for `raw` (then end of input), in order."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        got = b""
        try:
            while chunk := sock.recv(1 << 16):
                got += chunk
        except ConnectionResetError:
            pass
    return [line for line in got.split(b"\r\n") if line.startswith(b"HTTP/1.")]


@ENGINES
def test_the_engine_answers_the_parser_corpus_as_the_python_loop(start_server, threads: int) -> None:
    """Every request of the parser corpus (valid and invalid, tests/fuzz/grammar.py), over a real
    socket: the engine and the Python loop send the same status lines (same rejections, limits and
    status codes: what the engine does not take goes to the Python parser from its first byte)."""
    engine, python = _pair(start_server, threads)
    differ = []
    for raw in CORPUS:
        for data in (raw, get("/first") + raw):  # alone, and behind a request the engine serves
            ours, theirs = _answers(engine.port, data), _answers(python.port, data)
            if ours != theirs:
                differ.append((data, ours, theirs))
    assert not differ, differ[:5]


def _pair(start_server: Any, threads: int) -> tuple[Any, Any]:
    engine = native(start_server, threads)
    python = start_server("--wsgi-loop", "python", "--threads", str(threads), app=APP, workers=1)
    return engine, python


def _same_answers_to_fuzz(start_server: Any, threads: int, examples: int) -> None:
    engine, python = _pair(start_server, threads)

    @settings(max_examples=examples, deadline=None, derandomize=True)  # the suite stays deterministic
    @given(raw=fuzzed)
    def check(raw: bytes) -> None:
        assert _answers(engine.port, raw) == _answers(python.port, raw), raw

    check()


@ENGINES
def test_the_engine_answers_fuzzed_requests_as_the_python_loop(start_server, threads: int) -> None:
    """The fuzz grammar's requests and pipelines, mutated (tests/fuzz/grammar.py): the same status
    lines from both loops."""
    _same_answers_to_fuzz(start_server, threads, 150)


@pytest.mark.slow
@ENGINES
def test_the_engine_answers_many_fuzzed_requests_as_the_python_loop(start_server, threads: int) -> None:
    _same_answers_to_fuzz(start_server, threads, 1000)


# What only the pool engine does: its I/O thread needs no app thread and no GIL ----------------


def test_clients_that_do_not_read_hold_no_app_thread(start_server) -> None:
    """More clients than app threads stop reading their responses: the rest of each response waits
    in the I/O thread (not in a blocked app thread), so every app thread still serves others."""
    server = native(start_server, 2)
    stalled = []
    try:
        for _ in range(3):
            slow = socket.socket()
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            slow.connect(("127.0.0.1", server.port))
            slow.sendall(get("/big?60000") * 100)  # more than the kernel buffers hold
            stalled.append(slow)
        wait_until(lambda: all(sender_blocked(s) for s in stalled), what="the server blocked on 3 sockets")
        for _ in range(5):  # a blocked app thread would hold these until the write timeout (30 s)
            with connect(server.port) as sock:
                sock.settimeout(5)
                sock.sendall(get("/other"))
                assert responses(sock, ["GET"])[0][:2] == (200, b"GET /other? -")
        for slow in stalled:
            slow.settimeout(10)
            got = responses(slow, ["GET"] * 100)
            assert [body for _, body, _ in got] == [b"b" * 60000] * 100
    finally:
        for slow in stalled:
            slow.close()


def test_the_io_thread_cuts_a_slow_head_while_an_app_thread_holds_the_gil(start_server) -> None:
    """A request holds the GIL (a C call) for 4 s; a client that sends half a head meanwhile gets
    its 408 at the header timeout, before that request is answered: the deadlines need no GIL."""
    server = native(start_server, 2, "--header-timeout", "1")
    with connect(server.port) as holding, connect(server.port) as partial:
        holding.sendall(get("/hold?4"))
        [worker] = server.workers()
        wait_until(lambda: sleeping_threads(worker["pid"]), what="the request holding the GIL")
        partial.sendall(b"GET / HTTP/1.1\r\nHost: t\r\nAccept: te")  # (the common shape so far)
        partial.settimeout(10)
        assert partial.recv(1000).startswith(b"HTTP/1.1 408 ")
        holding.setblocking(False)
        with pytest.raises(BlockingIOError):
            holding.recv(1000)  # still holding the GIL
        holding.settimeout(10)
        assert responses(holding, ["GET"])[0][:2] == (200, b"held")
