"""ASGI: scope and response state machine (unit), and the asyncio/uvloop loop over real sockets."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import free_port, pids_alive
from support import paths
from support.waits import process_state, sender_blocked, wait_for_line, wait_until

from refork.asgi import ResponseState, build_scope, decode_path
from refork.config import Config
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies
from refork.warmup import warm

TESTS = paths.TESTS
ROOT = TESTS.parent


# ---------------------------------------------------------------------------------------------
# Unit: scope


def _request(**kw) -> Request:
    base = dict(
        method="GET",
        target=b"/a%20b/%C3%A9?x=1",
        path=b"/a%20b/%C3%A9",
        query=b"x=1",
        http_version="1.1",
        headers=[
            (b"host", b"example.com"),
            (b"x-forwarded-proto", b"https"),
            (b"x-forwarded-for", b"9.9.9.9"),
        ],
    )
    base.update(kw)
    return Request(**base)


def test_build_scope_basics():
    scope = build_scope(_request(), server=("127.0.0.1", 8000), client=("10.0.0.1", 5555), state={"k": 1})
    assert scope["type"] == "http"
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.4"}
    assert scope["http_version"] == "1.1"
    assert scope["method"] == "GET"
    assert scope["path"] == "/a b/é"
    assert scope["raw_path"] == b"/a%20b/%C3%A9"
    assert scope["query_string"] == b"x=1"
    assert scope["root_path"] == ""
    assert scope["scheme"] == "http"  # no proxies configured: X-Forwarded-* ignored
    assert scope["client"] == ("10.0.0.1", 5555)
    assert scope["server"] == ("127.0.0.1", 8000)
    assert [list(h) for h in scope["headers"]][0] == [b"host", b"example.com"]
    assert scope["state"] == {"k": 1}


def test_build_scope_state_is_a_copy():
    state = {"k": 1}
    scope = build_scope(_request(), server=None, client=None, state=state)
    scope["state"]["k"] = 2
    assert state == {"k": 1}


def test_build_scope_forwarded_only_from_trusted_peer():
    """The connection checks its peer once and passes the proxies only when it trusts it."""
    proxies = TrustedProxies(["127.0.0.1"])
    trusted = build_scope(_request(), server=None, client=("127.0.0.1", 1), proxies=proxies)
    assert trusted["scheme"] == "https"
    assert trusted["client"][0] == "9.9.9.9"
    untrusted = build_scope(_request(), server=None, client=("10.1.1.1", 1), proxies=None)
    assert untrusted["scheme"] == "http"
    assert untrusted["client"] == ("10.1.1.1", 1)


def test_build_scope_root_path():
    scope = build_scope(_request(path=b"/x"), server=None, client=None, root_path="/app")
    assert scope["root_path"] == "/app"
    assert scope["path"] == "/app/x"
    assert scope["raw_path"] == b"/app/x"
    already = build_scope(_request(path=b"/app/x"), server=None, client=None, root_path="/app")
    assert already["path"] == "/app/x"


def test_decode_path_bad_utf8_does_not_raise():
    assert decode_path(b"/%FF") == "/\ufffd"
    assert decode_path(b"/plain") == "/plain"


# ---------------------------------------------------------------------------------------------
# Unit: response state machine


def _start(status=200, headers=None):
    return {"type": "http.response.start", "status": status, "headers": headers or []}


def test_response_head_is_joined_to_first_body():
    state = ResponseState(_request())
    assert state.feed(_start(headers=[(b"content-length", b"2")])) == b""
    out = state.feed({"type": "http.response.body", "body": b"hi"})
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(b"\r\n\r\nhi")
    assert state.complete and state.status == 200 and state.body_bytes == 2
    assert state.will_keep_alive


def test_response_chunked_stream():
    state = ResponseState(_request())
    state.feed(_start())
    first = state.feed({"type": "http.response.body", "body": b"abc", "more_body": True})
    assert b"transfer-encoding: chunked" in first.lower()
    assert first.endswith(b"3\r\nabc\r\n")
    assert state.feed({"type": "http.response.body", "body": b"", "more_body": True}) == b""
    assert state.feed({"type": "http.response.body"}) == b"0\r\n\r\n"
    assert state.complete


def test_response_head_request_has_no_body():
    state = ResponseState(_request(method="HEAD"))
    state.feed(_start(headers=[(b"content-length", b"5")]))
    out = state.feed({"type": "http.response.body", "body": b"hello"})
    assert out.endswith(b"\r\n\r\n") and b"hello" not in out


@pytest.mark.parametrize(
    "messages, error",
    [
        ([{"type": "http.response.body", "body": b"x"}], "http.response.start"),
        ([_start(), _start()], "http.response.body"),
        ([_start(), {"type": "http.response.body"}, {"type": "http.response.body"}], "completed"),
        ([{"status": 200}], "type"),
        ([_start(status="200")], "status"),
        ([_start(headers=[("a", "b")])], "bytes"),
        ([_start(headers=[(b"bad name", b"v")])], "head"),
        ([_start(), {"type": "http.response.body", "body": "str"}], "bytes"),
    ],
)
def test_response_order_and_type_errors(messages, error):
    state = ResponseState(_request())
    with pytest.raises(RuntimeError, match=error):
        for message in messages:
            state.feed(message)


@pytest.mark.parametrize("value", [b"a\x0bb", b"a\x7f", b"\x01", b"a\r\nX-Injected: 1", b"a\x00"])
def test_response_header_value_with_a_control_character_is_an_app_error(value):
    state = ResponseState(_request())
    with pytest.raises(RuntimeError, match="head"):
        state.feed(_start(headers=[(b"x-bad", value)]))


@pytest.mark.parametrize("value", [b"close", b"Close", b"keep-alive, close"])
def test_response_app_connection_close_is_honoured(value):
    state = ResponseState(_request())
    out = state.feed(_start(headers=[(b"connection", value), (b"content-length", b"2")]))
    out += state.feed({"type": "http.response.body", "body": b"hi"})
    head = out.partition(b"\r\n\r\n")[0].lower()
    assert head.count(b"connection:") == 1 and b"\r\nconnection: close" in head
    assert state.complete and not state.will_keep_alive


def test_response_keep_alive_can_be_withdrawn_before_start():
    state = ResponseState(_request())
    state.keep_alive = False
    out = state.feed(_start(headers=[(b"content-length", b"0")])) + state.feed({"type": "http.response.body"})
    assert b"connection: close" in out.lower()
    assert not state.will_keep_alive


# ---------------------------------------------------------------------------------------------
# Unit: lifespan


def _run_lifespan(app):
    import asyncio

    from refork.asgi import Lifespan

    async def main():
        lifespan = Lifespan(app)
        await lifespan.startup()
        await lifespan.shutdown()
        return lifespan

    return asyncio.run(main())


def test_lifespan_complete_and_state():
    from apps import asgi_apps

    lifespan = _run_lifespan(asgi_apps.app)
    assert lifespan.supported and lifespan.state == {"started": "yes"}


def test_lifespan_unsupported_app():
    from apps import asgi_apps

    assert not _run_lifespan(asgi_apps.no_lifespan).supported
    assert not _run_lifespan(asgi_apps.hello).supported


def test_lifespan_failures_raise():
    from apps import asgi_apps

    from refork.asgi import LifespanFailure

    with pytest.raises(LifespanFailure, match="database unreachable"):
        _run_lifespan(asgi_apps.failing_startup)

    async def raises_in_startup(scope, receive, send):
        await receive()
        raise OSError("no disk")

    with pytest.raises(LifespanFailure, match="no disk"):
        _run_lifespan(raises_in_startup)


# ---------------------------------------------------------------------------------------------
# Unit: warm-up


def test_warmup_asgi_leaves_no_thread_or_loop():
    from apps import asgi_apps

    before = threading.active_count()
    results = warm(asgi_apps.app, "asgi", ["/", "/raise", "/noresponse", "/scope?q=1"], Config())
    assert results == [("/", 200), ("/raise", 500), ("/noresponse", 500), ("/scope?q=1", 200)]
    assert threading.active_count() == before
    import asyncio

    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


# ---------------------------------------------------------------------------------------------
# Real sockets


RUNNER = r"""
import os, signal, socket, sys
sys.path[:0] = [os.environ["TESTS_DIR"], os.path.dirname(os.environ["TESTS_DIR"])]
from support.harness import HarnessControl
from refork.config import Config
from refork.serving import serve
import importlib

spec, loop, bind, mode = sys.argv[1:5]
module, _, attr = spec.partition(":")
app = getattr(importlib.import_module(module), attr)

class Promoted(SystemExit):
    pass

class Control(HarnessControl):
    def __init__(self):
        super().__init__()
        self.want = False
    @property
    def safe_point_wanted(self):
        return self.want
    def request_finished(self, token, status):
        super().request_finished(token, status)
        if mode == "fork" and self.served == 1:
            self.want = True  # promote after the first response
    def at_safe_point(self):
        self.want = False
        import threading
        if threading.active_count() != 1:
            raise RuntimeError(f"threads alive at the safe point: {threading.enumerate()}")
        pid = os.fork()
        if pid == 0:
            raise Promoted(0)
        os.write(1, f"FORKED {pid}\n".encode())

if bind.startswith("unix:"):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(bind[5:])
else:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(bind)))
sock.listen(128)
sock.setblocking(False)
config = Config(app=spec, loop=loop, keepalive=1.0, header_timeout=1.0,
                access_logfile=os.environ.get("ACCESS_LOG"))
control = Control()
signal.signal(signal.SIGTERM, lambda *_: control.signal(b"T"))
signal.signal(signal.SIGINT, lambda *_: control.signal(b"I"))
print("READY", flush=True)
parent = os.getpid()
try:
    serve([sock], app, "asgi", config, control)
except Promoted:
    import time
    os.write(1, b"CHILD UNWOUND\n")
    os.close(1); os.close(2)
    # A mold lives on (its copies of client sockets must not keep them open): as long as the
    # server it was forked from, then it goes by itself.
    while os.getppid() == parent:
        time.sleep(0.05)
    os._exit(0)
print(f"SERVED {control.served}", flush=True)
"""


class Proc:
    """A serving subprocess: tests/support/harness.py (uvloop) or the RUNNER above (any loop, fork)."""

    def __init__(self, spec: str, *, loop: str | None = None, mode: str = "plain", env=None, unix: str = ""):
        self.port = free_port()
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TESTS_DIR": str(TESTS), **(env or {})}
        if loop is None:
            cmd = [sys.executable, str(TESTS / "support" / "harness.py"), spec, "asgi", str(self.port)]
        else:
            bind = f"unix:{unix}" if unix else str(self.port)
            cmd = [sys.executable, "-c", RUNNER, spec, loop, bind, mode]
        self.proc = subprocess.Popen(
            cmd, cwd=TESTS, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        if "READY" not in line:
            self.proc.kill()
            raise AssertionError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.lines: list[str] = []

    def connect(self, timeout: float = 5.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def finish(self, sig=signal.SIGTERM, timeout: float = 10.0) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def serve():
    procs: list[Proc] = []

    def start(spec: str = "apps.asgi_apps:app", **kw) -> Proc:
        proc = Proc(spec, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def read_response(sock: socket.socket, buf: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """Read exactly one response (Content-Length, chunked or until EOF) from a raw socket.

    Responses to pipelined requests may arrive in one recv(): read them all through one shared
    `buf`. Without one, bytes past this response would be lost, so they fail the test at once
    (rather than the next read waiting for a close that only the keep-alive timeout brings).
    """
    if buf is None:
        buf = bytearray()
        response = _read_response(sock, buf)
        assert not buf, f"bytes after the response (pass a shared buf): {bytes(buf[:80])!r}"
        return response
    return _read_response(sock, buf)


def _read_response(sock: socket.socket, buf: bytearray) -> tuple[int, dict[str, str], bytes]:

    def fill() -> bool:
        data = sock.recv(65536)
        buf.extend(data)
        return bool(data)

    while b"\r\n\r\n" not in buf:
        if not fill():
            raise ConnectionError(f"EOF before head: {bytes(buf)!r}")
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    del buf[: len(head) + 4]
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if status == 100 or status == 204 or status == 304:
        return status, headers, b""
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n and fill():
            pass
        body = bytes(buf[:n])
        del buf[:n]
    elif headers.get("transfer-encoding") == "chunked":
        chunks = bytearray()
        while True:
            while b"\r\n" not in buf:
                fill()
            size_line, _, _ = bytes(buf).partition(b"\r\n")
            size = int(size_line, 16)
            del buf[: len(size_line) + 2]
            while len(buf) < size + 2:
                fill()
            chunks += buf[:size]
            del buf[: size + 2]
            if size == 0:
                break
        body = bytes(chunks)
    else:
        while fill():
            pass
        body = bytes(buf)
        buf.clear()
    return status, headers, body


def exchange(proc: Proc, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with proc.connect() as sock:
        sock.sendall(raw)
        return read_response(sock)


def at_eof(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_get_and_post_echo_streamed_body(serve):
    proc = serve()
    status, headers, body = exchange(proc, b"GET /hello?x=1 HTTP/1.1\r\nHost: a\r\n\r\n")
    assert (status, body) == (200, b"GET /hello")
    payload = os.urandom(3 * 1024 * 1024)
    with proc.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(payload))
        for i in range(0, len(payload), 256 * 1024):
            sock.sendall(payload[i : i + 256 * 1024])
        status, headers, body = read_response(sock)
    assert status == 200 and body == payload
    assert int(headers["x-messages"]) > 1  # streamed to the app in pieces


def test_keep_alive_and_pipelining_in_order(serve):
    proc = serve()
    with proc.connect() as sock:
        buf = bytearray()
        sock.sendall(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock, buf)[2] == b"GET /one"
        sock.sendall(
            b"GET /slow?0.2 HTTP/1.1\r\nHost: a\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /three HTTP/1.1\r\nHost: a\r\n\r\n"
        )
        assert read_response(sock, buf)[2] == b"slow done"
        assert read_response(sock, buf)[2] == b"hello"
        assert read_response(sock, buf)[2] == b"GET /three"


def test_chunked_request_and_response(serve):
    proc = serve()
    raw = (
        b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    status, headers, body = exchange(proc, raw)
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert body == b"hello world|end"


def test_expect_100_continue(serve):
    proc = serve()
    with proc.connect() as sock:
        buf = bytearray()
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        status, _, _ = read_response(sock, buf)
        assert status == 100
        sock.sendall(b"data")
        status, _, body = read_response(sock, buf)
        assert (status, body) == (200, b"data")
        # The connection is still usable.
        sock.sendall(b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock, buf)[2] == b"GET /after"


def test_expect_100_continue_not_sent_when_app_ignores_body(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"POST /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        status, headers, body = read_response(sock)
        assert (status, body) == (200, b"POST /hello")
        assert headers.get("connection") == "close"
        assert at_eof(sock)


def test_response_head_is_sent_before_the_first_body_message(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"POST /head-first HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)  # would block forever if the head waited for the body
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
        sock.sendall(b"ping")
        data = head.partition(b"\r\n\r\n")[2]
        while not data.endswith(b"0\r\n\r\n"):
            data += sock.recv(65536)
        assert data == b"4\r\nping\r\n0\r\n\r\n"


def test_head_http10_and_connection_close(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"HEAD /big?5000 HTTP/1.1\r\nHost: a\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n")
        assert b"content-length: 5000" in data.lower()
        sock.sendall(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock)[2] == b"GET /next"  # no stray body bytes after the HEAD
    with proc.connect() as sock:
        sock.sendall(b"GET /old HTTP/1.0\r\n\r\n")
        status, headers, body = read_response(sock)
        assert status == 200 and body == b"GET /old"
        assert at_eof(sock)
    with proc.connect() as sock:
        sock.sendall(b"GET /bye HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        status, headers, body = read_response(sock)
        assert body == b"GET /bye" and headers["connection"] == "close"
        assert at_eof(sock)


def test_malformed_request_gets_400_and_app_not_called(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    with proc.connect() as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nbad header\r\n\r\n")
        status, _, _ = read_response(sock)
        assert status == 400
        assert at_eof(sock)
    # A valid request pipelined before a bad one is answered first.
    with proc.connect() as sock:
        buf = bytearray()
        sock.sendall(b"GET /slow?0.1 HTTP/1.1\r\nHost: a\r\n\r\n")
        wait_for_line(logfile, "slow")  # the bad request arrives while the good one is in the app
        sock.sendall(b"GARBAGE\r\n\r\n")
        assert read_response(sock, buf)[0] == 200
        assert read_response(sock, buf)[0] == 400
    code, out, err = proc.finish()
    assert "SERVED 1" in out  # only the /slow request reached the app


@pytest.mark.parametrize("path", ["/raise", "/noresponse", "/bad-order"])
def test_app_errors_give_500(serve, path):
    proc = serve()
    status, _, _ = exchange(proc, b"GET %s HTTP/1.1\r\nHost: a\r\n\r\n" % path.encode())
    assert status == 500
    assert exchange(proc, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[0] == 200
    code, out, err = proc.finish()
    assert "ASGI" in err


def test_app_raising_after_start_closes_connection(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"GET /raise-after-start HTTP/1.1\r\nHost: a\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"partial")


def test_lifespan_startup_state_and_shutdown(serve, tmp_path):
    logfile = tmp_path / "lifespan.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    status, _, body = exchange(proc, b"GET /scope HTTP/1.1\r\nHost: a\r\n\r\n")
    assert logfile.read_text() == "startup\n"  # startup ran before the first request was served
    assert json.loads(body)["state"] == {"started": "yes"}
    code, out, err = proc.finish()
    assert code == 0, err
    assert logfile.read_text() == "startup\nshutdown\n"


def test_app_without_lifespan_still_serves(serve):
    proc = serve("apps.asgi_apps:no_lifespan")
    assert exchange(proc, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[2] == b"no lifespan here"
    code, out, err = proc.finish()
    assert code == 0 and "Traceback" not in err


def test_lifespan_startup_failure_exits(serve):
    proc = serve("apps.asgi_apps:failing_startup")
    code, out, err = proc.finish(sig=0)  # it exits by itself
    assert code != 0
    assert "database unreachable" in err and "worker exiting" in err


def test_graceful_stop_lets_in_flight_request_finish(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    idle = proc.connect()
    idle.sendall(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    read_response(idle)
    with proc.connect() as sock:
        sock.sendall(b"GET /slow?1 HTTP/1.1\r\nHost: a\r\n\r\n")
        wait_for_line(logfile, "slow")  # the request is in the app
        proc.proc.send_signal(signal.SIGTERM)
        status, headers, body = read_response(sock)
        assert (status, body) == (200, b"slow done")
        assert headers["connection"] == "close"
    assert at_eof(idle)  # the idle keep-alive connection was closed
    idle.close()
    code, out, err = proc.finish(sig=0)
    assert code == 0 and "SERVED 2" in out


def test_sigint_stops_at_once(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    with proc.connect() as sock:
        sock.sendall(b"GET /slow?30 HTTP/1.1\r\nHost: a\r\n\r\n")
        wait_for_line(logfile, "slow")  # the request is in the app
        code, out, err = proc.finish(sig=signal.SIGINT, timeout=5)
    assert code == 0


@pytest.mark.parametrize("half_close", [False, True])
def test_disconnect_mid_body_reaches_the_app(serve, tmp_path, half_close):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    sock = proc.connect()
    sock.sendall(b"POST /wait-disconnect HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\npartial")
    wait_for_line(logfile, "waiting for the disconnect")  # the request is in the app
    if half_close:
        sock.shutdown(socket.SHUT_WR)
    else:
        sock.close()
    wait_for_line(logfile, "disconnected")
    assert logfile.read_text() == "startup\nwaiting for the disconnect\ndisconnected\n"
    sock.close()
    code, out, err = proc.finish()
    assert code == 0 and "Traceback" not in err, err


def test_client_disconnect_during_slow_request(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    sock = proc.connect()
    sock.sendall(b"GET /slow?0.3 HTTP/1.1\r\nHost: a\r\n\r\n")
    wait_for_line(logfile, "slow")  # the request is in the app
    sock.close()
    wait_for_line(logfile, "slow over")  # the app is done with a client that was gone
    assert exchange(proc, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[0] == 200
    code, out, err = proc.finish()
    assert "Exception" not in err, err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_streamed_response_with_slow_reader_and_access_log(serve, loop, tmp_path):
    access = tmp_path / "access.log"
    proc = serve(loop=loop, env={"ACCESS_LOG": str(access)})
    with proc.connect(timeout=10) as sock:
        sock.sendall(b"GET /stream?300 HTTP/1.1\r\nHost: a\r\n\r\n")
        # not reading: the server hits its write buffer limit and must wait (drain)
        wait_until(lambda: sender_blocked(sock), what="the server blocked on the unread socket")
        status, headers, body = read_response(sock)
        assert status == 200 and len(body) == 300 * 65536
        sock.sendall(b"GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, body = read_response(sock)
        assert body == b"GET /hello" and headers["connection"] == "keep-alive"
    code, out, err = proc.finish()
    assert code == 0, err
    lines = access.read_text().splitlines()
    assert len(lines) == 2 and '"GET /stream?300 HTTP/1.1" 200 19660800' in lines[0], lines


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_both_loops_keepalive_timeout_and_unix_socket(serve, loop, tmp_path):
    path = str(tmp_path / "s.sock")
    proc = serve(loop=loop, unix=path)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"GET /scope HTTP/1.1\r\nHost: a\r\n\r\n")
        status, _, body = read_response(sock)
        info = json.loads(body)
        assert info["client"] is None and info["server"] == [path, None]
        assert at_eof(sock)  # keep-alive timeout (1 s) closes the idle connection
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"GET / HTTP/1.1\r\nHost:")
        assert read_response(sock)[0] == 408  # header timeout (1 s)
        assert at_eof(sock)
    code, out, err = proc.finish()
    assert code == 0, err


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_safe_point_fork_child_unwinds_and_parent_keeps_serving(serve, loop):
    proc = serve(loop=loop, mode="fork")
    before = proc.connect()  # open across the fork
    with proc.connect() as sock:
        sock.sendall(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock)[2] == b"GET /first"
    lines = sorted(proc.proc.stdout.readline() for _ in range(2))
    assert lines[0] == "CHILD UNWOUND\n", lines  # the SystemExit subclass left serve_asgi
    assert lines[1].startswith("FORKED"), lines
    child = int(lines[1].split()[1])
    # The parent still accepts and serves, also on the connection that existed at fork time...
    for _ in range(3):
        assert exchange(proc, b"GET /again HTTP/1.1\r\nHost: a\r\n\r\n")[2] == b"GET /again"
    before.sendall(b"GET /old-conn HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert read_response(before)[2] == b"GET /old-conn"
    # ...and when the parent closes it, the client sees EOF although the child is still alive.
    before.settimeout(2)
    assert at_eof(before)
    assert pids_alive([child]) == [child]
    before.close()
    code, out, err = proc.finish()
    assert code == 0, err
    assert "SERVED 5" in out
    wait_until(lambda: process_state(child) in (None, "Z"), what="the child to follow its parent")


# ---------------------------------------------------------------------------------------------
# Issue 8: exact bytes over a socket (ASGI loop)

RFC_APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    if scope["path"] == "/close":
        headers = [(b"connection", b"close"), (b"content-length", b"3")]
    elif scope["path"] == "/ctl":
        headers = [(b"x-bad", b"a\\x0bb"), (b"content-length", b"3")]
    else:
        headers = [(b"content-length", b"3")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"bye"})
"""


@pytest.fixture
def rfc_app(serve, tmp_path):
    (tmp_path / "rfc_app.py").write_text(RFC_APP)
    return serve("rfc_app:app", env={"PYTHONPATH": str(tmp_path)})


def test_app_connection_close_is_honoured_over_a_socket(rfc_app):
    sock = rfc_app.connect()
    sock.sendall(b"GET /close HTTP/1.1\r\nHost: a\r\n\r\nGET /other HTTP/1.1\r\nHost: a\r\n\r\n")
    status, headers, body = read_response(sock)
    assert status == 200 and body == b"bye" and headers["connection"] == "close"
    assert at_eof(sock)
    sock.close()


def test_control_character_in_an_app_header_is_a_500_over_a_socket(rfc_app):
    sock = rfc_app.connect()
    sock.sendall(b"GET /ctl HTTP/1.1\r\nHost: a\r\n\r\n")
    raw = b""
    while not raw.endswith(b"\r\n\r\nInternal Server Error"):
        data = sock.recv(65536)
        if not data:
            break
        raw += data
    sock.close()
    assert raw.startswith(b"HTTP/1.1 500 ") and b"\x0b" not in raw
    _, _, err = rfc_app.finish()
    assert "Invalid response head" in err


def test_unknown_method_and_http12_over_a_socket(rfc_app):
    sock = rfc_app.connect()
    sock.sendall(b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.2\r\nHost: a\r\n\r\n")
    buf = bytearray()  # both responses may come in one recv()
    assert read_response(sock, buf)[0] == 200
    status, headers, _ = read_response(sock, buf)
    assert status == 200 and "connection" not in headers  # answered as 1.1: kept alive
    sock.close()


def test_endless_trailer_gets_431_over_a_socket(serve):
    from support.load import send_until_refused

    proc = serve()
    sock = proc.connect()
    head = b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: "
    sent, answer = send_until_refused(sock, head, b"A" * 65536, 20 << 20)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert sent < 20 << 20


def test_unknown_method_behind_a_request_split_across_sends(serve):
    proc = serve()
    sock = proc.connect()
    sock.sendall(b"GET /one HTTP/1.1\r\nHo")
    time.sleep(0.05)  # (the input, not a wait) most likely two reads; the outcome must not depend on it
    sock.sendall(b"st: a\r\n\r\nX-SYNC /two HTTP/1.1\r\nHost: a\r\n\r\n")
    buf = bytearray()
    assert read_response(sock, buf)[2] == b"GET /one"
    assert read_response(sock, buf)[2] == b"X-SYNC /two"
    sock.close()


BAD_HEAD = b"GET /bad HTTP/1.1\r\nHost x\r\n\r\n"  # a field line without its colon


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_pipeline_valid_invalid_valid_answers_the_first_then_400(serve, loop):
    """RFC 9112 9.3.2: the requests before the bad one are answered in order and fully written
    (3 MB: more than the socket buffers), then the 400, then the connection closes."""
    proc = serve(loop=loop)
    sock = proc.connect()
    sock.sendall(
        b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /big?3000000 HTTP/1.1\r\nHost: a\r\n\r\n"
        + BAD_HEAD
        + b"GET /three HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    buf = bytearray()
    assert read_response(sock, buf)[2] == b"GET /one"
    assert read_response(sock, buf)[2] == b"x" * 3000000
    assert read_response(sock, buf)[0] == 400
    assert not buf and at_eof(sock)
    sock.close()


def test_a_bad_body_behind_a_running_request_is_answered_after_it(serve):
    """The request whose body turned bad was queued behind a running one: it never starts; the
    running one is answered, then the 400."""
    proc = serve()
    sock = proc.connect()
    sock.sendall(
        b"GET /slow?0.2 HTTP/1.1\r\nHost: a\r\n\r\n"
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n"
    )
    buf = bytearray()
    assert read_response(sock, buf)[2] == b"slow done"
    assert read_response(sock, buf)[0] == 400
    assert not buf and at_eof(sock)
    sock.close()


def test_a_bad_body_under_a_waiting_app_gets_400_and_the_app_a_disconnect(serve):
    """The app is in receive() when the chunked body turns bad: it sees http.disconnect, the
    client gets the 400 (the app had not started a response)."""
    proc = serve()
    sock = proc.connect()
    sock.sendall(
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    )
    buf = bytearray()
    assert read_response(sock, buf)[0] == 100  # sent when the app calls receive(): it waits there
    sock.sendall(b"2\r\nhi\r\nzz\r\n")
    assert read_response(sock, buf)[0] == 400
    assert not buf and at_eof(sock)
    sock.close()
    code, _, err = proc.finish()
    assert code == 0 and "Exception in ASGI application" not in err, err


def test_trailers_and_absolute_form_host_in_the_scope(serve):
    proc = serve()
    sock = proc.connect()
    sock.sendall(
        b"POST /scope HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\nz\r\n0\r\nX-Trailer: t\r\n\r\n"
        b"GET http://target.example:81/scope HTTP/1.1\r\nHost: ignored\r\n\r\n"
    )
    buf = bytearray()  # both responses may arrive in one recv()
    first = json.loads(read_response(sock, buf)[2])
    second = json.loads(read_response(sock, buf)[2])
    sock.close()
    assert [n for n, _ in first["headers"]] == ["host", "transfer-encoding"]
    assert ["host", "target.example:81"] in second["headers"] and second["path"] == "/scope"
