"""The rest of ASGI (issue 11): prompt http.disconnect, pathsend / zerocopysend, trailers, lifespan state.

Real `python -m refork` processes and raw sockets (the bytes on the wire are the point); the apps
are in tests/apps/asgi_ext_apps.py and append what they see to EVENTS_LOG.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import signal
import socket
import ssl
from pathlib import Path

import pytest
from conftest import free_port, read_to_end
from support.certs import Certs
from support.waits import sender_blocked, wait_for_line, wait_until

APP = "apps.asgi_ext_apps:app"
STARLETTE = "apps.asgi_ext_apps:starlette_app"
LOOPS = ["asyncio", "uvloop"]


def in_flight(mport: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", mport, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("refork_worker_requests_in_flight{"))  # fmt: skip


def start(start_server, tmp_path, *args: str, app: str = APP, loop: str = "asyncio"):
    """One worker with metrics (requests in flight), a keep-alive timeout far above what we wait."""
    mport = free_port()
    events = tmp_path / "events.log"
    server = start_server("--loop", loop, "--keepalive", "30", "--metrics-bind", f"127.0.0.1:{mport}",
                          *args, app=app, workers=1, env={"EVENTS_LOG": str(events)})  # fmt: skip
    return server, mport, events


def read_head(sock: socket.socket, data: bytes = b"") -> tuple[bytes, bytes]:
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def headers_of(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}


def read_body(sock: socket.socket, rest: bytes, length: int) -> bytes:
    while len(rest) < length:
        chunk = sock.recv(1 << 20)
        assert chunk, len(rest)
        rest += chunk
    return rest


def read_chunked(sock: socket.socket, rest: bytes) -> tuple[bytes, bytes]:
    """(body, the raw trailer section including its final CRLF) of a chunked response."""
    body = b""
    while True:
        while b"\r\n" not in rest:
            chunk = sock.recv(65536)
            assert chunk
            rest += chunk
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            while not (rest.startswith(b"\r\n") or b"\r\n\r\n" in rest):
                chunk = sock.recv(65536)
                assert chunk
                rest += chunk
            return body, rest
        rest = read_body(sock, rest, size + 2)
        body += rest[:size]
        rest = rest[size + 2 :]


# ---------------------------------------------------------------------------------------------
# http.disconnect


@pytest.mark.parametrize("loop", LOOPS)
def test_sse_client_gone_after_1s_app_sees_disconnect_and_the_task_is_freed(start_server, tmp_path, loop):
    server, mport, events = start(start_server, tmp_path, loop=loop)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"GET /sse HTTP/1.1\r\nHost: a\r\n\r\n")
    head, rest = read_head(sock)
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head
    data = rest
    while b"data: 9\n\n" not in data:  # ten events (an event every 100 ms): the stream runs
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    assert b"data: 0\n\n" in data
    assert server.wait_for(lambda: in_flight(mport) == 1, what="the stream in flight")
    sock.close()
    line = wait_for_line(events, "http.disconnect")
    assert float(line.split()[1]) < 30  # the keep-alive timeout; in practice ~1 s
    assert wait_for_line(events, "late send raised") == "late send raised ClientDisconnected True"
    wait_for_line(events, "sse task ended")
    server.wait_for(lambda: in_flight(mport) == 0, timeout=5, what="no request in flight")
    assert server.get("/nothing")[0] == 404  # the worker serves on
    assert "Traceback" not in server.log() and "ERROR" not in server.log(), server.log()


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("how", ["eof", "rst", "half-close"])
def test_long_poll_sees_disconnect_when_the_peer_closes(start_server, tmp_path, loop, how):
    server, mport, events = start(start_server, tmp_path, loop=loop)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"GET /longpoll HTTP/1.1\r\nHost: a\r\n\r\n")
    wait_for_line(events, "waiting")
    if how == "rst":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
    elif how == "eof":
        sock.close()
    else:
        sock.shutdown(socket.SHUT_WR)
    line = wait_for_line(events, "http.disconnect")
    assert float(line.split()[1]) < 30
    server.wait_for(lambda: in_flight(mport) == 0, timeout=5, what="no request in flight")
    if how == "half-close":
        assert read_to_end(sock) == b""  # the app did not answer: the connection is closed, no 500
    sock.close()
    assert "Traceback" not in server.log() and "ERROR" not in server.log(), server.log()


@pytest.mark.parametrize("loop", LOOPS)
def test_long_poll_over_tls_sees_disconnect(start_server, tmp_path, loop):
    certs = Certs(tmp_path)
    server, mport, events = start(start_server, tmp_path, *certs.args(), loop=loop)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    tls = certs.client_context().wrap_socket(raw, server_hostname="127.0.0.1")
    tls.sendall(b"GET /longpoll HTTP/1.1\r\nHost: a\r\n\r\n")
    wait_for_line(events, "waiting")
    tls.close()
    wait_for_line(events, "http.disconnect")
    server.wait_for(lambda: in_flight(mport) == 0, timeout=5, what="no request in flight")


def test_starlette_streaming_response_stops_when_the_client_goes(start_server, tmp_path):
    """Starlette (spec 2.4) stops on the OSError from send() rather than watching receive()."""
    server, mport, events = start(start_server, tmp_path, app=STARLETTE)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n")
    head, data = read_head(sock)
    assert head.startswith(b"HTTP/1.1 200")
    while b"data: 9\n\n" not in data:  # ten events (an event every 100 ms): the stream runs
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    sock.close()
    wait_for_line(events, "starlette stream closed")
    server.wait_for(lambda: in_flight(mport) == 0, timeout=5, what="no request in flight")
    assert "Traceback" not in server.log(), server.log()


# ---------------------------------------------------------------------------------------------
# pathsend / zerocopysend


@pytest.fixture
def blob(tmp_path) -> Path:
    path = tmp_path / "blob.bin"
    path.write_bytes(os.urandom(5 * 1024 * 1024 + 123))
    return path


def fetch(port: int, target: str, *, ctx: ssl.SSLContext | None = None, method: str = "GET") -> tuple:
    if ctx is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=20, context=ctx)
    try:
        conn.request(method, target)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("tls", [False, True])
def test_pathsend_serves_a_file_intact(start_server, tmp_path, blob, loop, tls):
    certs = Certs(tmp_path) if tls else None
    server, mport, events = start(start_server, tmp_path, *(certs.args() if certs else ()), loop=loop)
    ctx = certs.client_context() if certs else None
    want = hashlib.sha256(blob.read_bytes()).hexdigest()
    for length in ("app", "none"):  # the app's Content-Length, or none: chunked
        status, headers, body = fetch(server.port, f"/pathsend?path={blob}&length={length}", ctx=ctx)
        assert status == 200 and hashlib.sha256(body).hexdigest() == want
        if length == "app":
            assert headers["content-length"] == str(blob.stat().st_size)
        else:
            assert headers["transfer-encoding"] == "chunked"
    status, headers, body = fetch(server.port, f"/pathsend?path={blob}", ctx=ctx, method="HEAD")
    assert status == 200 and body == b"" and headers["content-length"] == str(blob.stat().st_size)
    # a missing file: the app gets FileNotFoundError from send(), the client a clean 500
    status, headers, body = fetch(server.port, f"/pathsend?path={tmp_path}/missing&length=none", ctx=ctx)
    assert status == 500
    wait_for_line(events, "pathsend FileNotFoundError")
    assert fetch(server.port, f"/pathsend?path={blob}", ctx=ctx)[0] == 200  # the worker serves on


@pytest.mark.parametrize("loop", LOOPS)
def test_pathsend_keep_alive_and_slow_reader(start_server, tmp_path, blob, loop):
    """Two responses on one connection, the first read slowly (the kernel's buffer fills)."""
    server, mport, events = start(start_server, tmp_path, loop=loop)
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.sendall(f"GET /pathsend?path={blob} HTTP/1.1\r\nHost: a\r\n\r\n".encode() * 2)
        wait_until(lambda: sender_blocked(sock), what="the server blocked on the unread socket")
        size = blob.stat().st_size
        rest = b""
        for _ in range(2):
            head, rest = read_head(sock, rest)
            assert int(headers_of(head)["content-length"]) == size
            body = read_body(sock, rest, size)
            assert body[:size] == blob.read_bytes()
            rest = body[size:]
        assert rest == b""


@pytest.mark.parametrize("loop", LOOPS)
@pytest.mark.parametrize("tls", [False, True])
def test_client_gone_in_the_middle_of_a_file(start_server, tmp_path, blob, loop, tls):
    certs = Certs(tmp_path) if tls else None
    server, mport, events = start(start_server, tmp_path, *(certs.args() if certs else ()), loop=loop)
    for how in ("eof", "rst"):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        if certs:
            sock = certs.client_context().wrap_socket(sock, server_hostname="127.0.0.1")
        sock.sendall(f"GET /pathsend?path={blob} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
        head, rest = read_head(sock)
        sock.recv(10000)
        # the server is stuck on a full socket buffer
        wait_until(lambda sock=sock: sender_blocked(sock), what="the server blocked on the unread socket")
        if how == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
        server.wait_for(lambda: in_flight(mport) == 0, timeout=10, what="no request in flight")
    ctx = certs.client_context() if certs else None
    status, headers, body = fetch(server.port, f"/pathsend?path={blob}", ctx=ctx)
    assert status == 200 and body == blob.read_bytes()
    log = server.log()
    assert "Traceback" not in log and "ERROR" not in log, log


@pytest.mark.parametrize("loop", LOOPS)
def test_zerocopysend_offset_count_and_position(start_server, tmp_path, blob, loop):
    server, mport, events = start(start_server, tmp_path, loop=loop)
    data = blob.read_bytes()
    # offset+count, count from the current position (0), offset to the end, and past the end
    parts = f"100:1000,:50,{len(data) - 10}:,{len(data) + 5}:"
    status, headers, body = fetch(server.port, f"/zerocopy?path={blob}&parts={parts}")
    assert status == 200 and headers["transfer-encoding"] == "chunked"
    want = data[100:1100] + b"|" + data[:50] + b"|" + data[-10:] + b"|" + b"|" + b"end"
    assert body == want
    assert wait_for_line(events, "position") == "position 50"  # only the offset-less send moved it
    status, headers, body = fetch(server.port, f"/zerocopy?path={blob}&parts=:")  # the whole file
    assert body == data + b"|end"


def test_starlette_file_response_uses_pathsend(start_server, tmp_path, blob):
    server, mport, events = start(start_server, tmp_path, app=STARLETTE)
    status, headers, body = fetch(server.port, f"/file?path={blob}")
    assert status == 200 and body == blob.read_bytes()
    assert headers["content-length"] == str(blob.stat().st_size)


# ---------------------------------------------------------------------------------------------
# trailers


def _raw(port: int, request: bytes) -> tuple[bytes, bytes, socket.socket]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(request)
    head, rest = read_head(sock)
    return head, rest, sock


@pytest.mark.parametrize("length", ["", "&length=1"])
def test_trailers_sent_when_the_client_asks(start_server, tmp_path, length):
    server, mport, events = start(start_server, tmp_path)
    request = f"GET /trailers?x{length} HTTP/1.1\r\nHost: a\r\nTE: trailers\r\n\r\n"
    head, rest, sock = _raw(server.port, request.encode())
    with sock:
        headers = headers_of(head)
        assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
        assert headers["trailer"] == "x-checksum, x-count"
        body, trailer = read_chunked(sock, rest)
        assert body == b"hello world"
        # the exact bytes: both messages' fields, content-length dropped (RFC 9110 6.5.1), one CRLF
        assert trailer == b"x-checksum: abc123\r\nx-count: 2\r\n\r\n"
        sock.sendall(b"GET /trailers HTTP/1.1\r\nHost: a\r\nTE: gzip, trailers;q=1\r\n\r\n")  # keep-alive
        head, rest = read_head(sock)
        assert read_chunked(sock, rest) == (b"hello world", b"x-checksum: abc123\r\nx-count: 2\r\n\r\n")


def test_trailers_dropped_without_te(start_server, tmp_path):
    server, mport, events = start(start_server, tmp_path)
    head, rest, sock = _raw(server.port, b"GET /trailers HTTP/1.1\r\nHost: a\r\n\r\n")
    with sock:
        assert headers_of(head)["transfer-encoding"] == "chunked"
        assert read_chunked(sock, rest) == (b"hello world", b"\r\n")  # the plain last chunk
    head, rest, sock = _raw(server.port, b"GET /trailers?length=1 HTTP/1.1\r\nHost: a\r\n\r\n")
    with sock:
        assert headers_of(head)["content-length"] == "11"  # the app's framing is kept
        assert read_body(sock, rest, 11) == b"hello world"
        sock.sendall(b"GET /trailers HTTP/1.0\r\nTE: trailers\r\n\r\n")  # 1.0: no chunked, no trailers
        head, rest = read_head(sock)
        assert rest + read_to_end(sock) == b"hello world"


# ---------------------------------------------------------------------------------------------
# lifespan state


def test_lifespan_state_reaches_each_request_as_a_copy(start_server, tmp_path):
    server, mport, events = start(start_server, tmp_path, app=STARLETTE)
    pid = server.workers()[0]["pid"]
    first = server.get("/state")
    second = server.get("/state")
    assert first == (200, f"hello from lifespan in {pid} 1".encode())
    assert second == (200, f"hello from lifespan in {pid} 2".encode())  # shared objects, one dict each
    assert server.get("/leak") == (200, b"False")  # request.state.mine did not leak


def test_failing_lifespan_startup_ends_the_start_with_one_line_and_no_traceback(start_server, tmp_path):
    server = start_server(app="apps.asgi_apps:failing_startup", workers=1, wait=False)
    assert server.wait_exit(60) == 3  # (its crash-loop back-off: about 14 s on a quiet machine)
    log = server.log()
    failed = "worker 0 failed while running the ASGI lifespan startup: ASGI lifespan startup failed: "
    assert f"{failed}database unreachable" in log
    assert f"refork: error: no worker could start: {failed}database unreachable" in log.splitlines()[-1]
    assert "Traceback" not in log and "crash loop" in log, log


def test_a_worker_is_ready_only_once_its_lifespan_startup_is_done(start_server, tmp_path):
    """Readiness (and rollouts) count a worker as started only after lifespan startup succeeded:
    before, its app may not have its database pool yet."""
    mark = str(tmp_path / "started-")
    server = start_server(app="apps.slow_lifespan:app", workers=2, env={"REFORK_TEST_MARK": mark})
    for worker in server.workers():
        assert os.path.exists(f"{mark}{worker['pid']}"), server.log()
    assert server.get("/")[0] == 200


def test_a_fast_stop_is_not_an_error_of_the_lifespan_task(start_server, tmp_path):
    """INT cancels the task waiting for lifespan.shutdown: no error line, no traceback."""
    server = start_server(app="apps.slow_lifespan:app", workers=1,
                          env={"REFORK_TEST_MARK": str(tmp_path / "started-")})  # fmt: skip
    assert server.get("/")[0] == 200
    server.signal(signal.SIGINT)
    server.wait_exit()
    assert "[ERROR]" not in server.log() and "Traceback" not in server.log(), server.log()
