"""The native WSGI loop (refork.serving.wsgi.native_parts, refork._native): what is specific to it.

The rest of its behaviour is the Python loop's contract, checked by running the WSGI, HTTP and
process suites a second time on the other loop (./scripts/test; REFORK_WSGI_LOOP).

- Parser parity: refork._native.Parser must give the events and the status of
  refork.http.parser.RequestParser for every input of the parser corpus (tests/http/test_http_parser.py)
  and of the fuzz grammar (tests/fuzz/grammar.py), whole, cut byte by byte, and cut in random
  places, under the default and tight limits.
- The extension is built and chosen: `auto` logs which loop runs; `native` without the extension
  is one config error line (exit 2).
- The threads of a native worker (the pool engine's I/O thread and the app threads with
  --threads), none in a mold, and a promoted worker's child serves from the new generation under
  load (the pool engine's own behaviour: tests/serving/test_native_engine.py).
"""

from __future__ import annotations

import http.client
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT
from fuzz.grammar import CORPUS, cut_points, fuzzed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.http_vectors import merge_bodies

from refork.http.body import EMPTY_INPUT, BodyBuffer, Spool
from refork.http.events import Event, ParseError, Request
from refork.http.forwarded import TrustedProxies
from refork.http.parser import Limits, RequestParser
from refork.http.response import simple_response
from refork.serving.parsers import native_parser
from refork.serving.wsgi.choice import available, choose
from refork.serving.wsgi.native_parts import NativeEnvironBuilder, start_wsgi_native
from refork.wsgi import EnvironBuilder, start_wsgi


def test_the_extension_is_built() -> None:
    """The test install builds it (cargo is required here): never skip the native tests."""
    assert available()

LIMITS = [
    Limits(),
    Limits(max_request_line=40, max_header_count=3, max_header_size=24, max_body=5),
    Limits(max_request_line=0, max_header_count=0, max_header_size=0, max_body=0),
]


def run(parser: object, raw: bytes, cuts: list[int]) -> tuple[list[Event], int | None]:
    events: list[Event] = []
    bounds = [0, *cuts, len(raw)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        try:
            events.extend(parser.feed(raw[start:end]))  # type: ignore[attr-defined]
        except ParseError as error:
            events.extend(error.events)
            try:
                parser.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")  # type: ignore[attr-defined]
            except ParseError as again:
                assert again is error
            else:
                raise AssertionError("a parser that failed must fail again") from None
            return merge_bodies(events), error.status
    return merge_bodies(events), None


def same(raw: bytes, cuts: list[int], limits: Limits) -> None:
    expected = run(RequestParser(limits), raw, cuts)
    got = run(native_parser(limits), raw, cuts)
    assert got == expected, (raw, cuts, limits)


@pytest.mark.parametrize("limits", LIMITS, ids=["default", "tight", "unlimited"])
def test_the_native_parser_agrees_on_the_corpus(limits: Limits) -> None:
    pipelined = [a + b for a, b in zip(CORPUS, CORPUS[1:], strict=False)]
    for raw in CORPUS + pipelined:
        same(raw, [], limits)
        same(raw, list(range(1, len(raw))), limits)  # byte by byte
        same(raw, [len(raw) // 2], limits)


@settings(max_examples=300, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(st.data(), fuzzed, st.sampled_from(LIMITS))
def test_the_native_parser_agrees_on_fuzzed_input(data: st.DataObject, raw: bytes, limits: Limits) -> None:
    same(raw, [], limits)
    same(raw, data.draw(cut_points(raw)), limits)


def test_the_fast_path_builds_what_the_python_parser_builds() -> None:
    raw = (
        b"GET /a%20b?x=1&y HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: t \r\nCookie: a=1\r\n"
        b"Cookie: b=2\r\nConnection: keep-alive\r\n\r\n"
        b"POST /p HTTP/1.0\r\nContent-Length: 3\r\nConnection: Keep-Alive\r\n\r\nabc"
        b"DELETE /d HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\nGET /ignored HTTP/1.1\r\n\r\n"
    )
    same(raw, [], Limits())
    events = native_parser(Limits()).feed(raw)
    assert [type(e).__name__ for e in events] == [
        "Request", "EndOfMessage", "Request", "Body", "EndOfMessage", "Request", "EndOfMessage",
    ]  # fmt: skip



WEBSOCKET = (
    b"GET /chat HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


@pytest.mark.parametrize("before", [b"", b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"], ids=["first", "pipelined"])
def test_a_websocket_handshake_is_handed_off_as_the_python_parser_does(before: bytes) -> None:
    """The ASGI loop's parser (hand_off_websocket): it stops after the handshake, and `upgraded`
    holds the bytes after its head in the same read (the start of the WebSocket stream; later
    reads go to the WebSocket's protocol), however the reads fall."""
    raw = before + WEBSOCKET + b"\x81\x85frame" + b"GET /never HTTP/1.1\r\nHost: h\r\n\r\n"
    for cuts in ([], list(range(1, len(raw))), [len(before) + len(WEBSOCKET)]):
        python = RequestParser(Limits(), hand_off_websocket=True)
        native = native_parser(Limits(), hand_off_websocket=True)
        assert run(native, raw, cuts) == run(python, raw, cuts)
        assert native.upgraded == python.upgraded
        assert native.upgraded is not None
        if not cuts:
            assert native.upgraded.startswith(b"\x81\x85frame")
        assert not native.in_message
        assert native.feed(b"more") == []
    assert native_parser(Limits()).upgraded is None

BUILDERS = [
    dict(server=("127.0.0.1", 8000)),
    dict(server="/tmp/x.sock", url_scheme="https", root_path="/app/"),
    dict(server=("::1", 443), url_scheme="https", proxies=TrustedProxies(["127.0.0.1"])),
]
EXTRA = [
    b"GET /app/x%41%zz%?a=%20 HTTP/1.1\r\nHost: [::1]:99\r\nCookie: a\r\nCookie: b\r\nA: 1\r\nA: 2\r\n\r\n",
    b"GET /app HTTP/1.1\r\nHost: h\xe9:x\r\nX_Y: 1\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n",
    b"POST /x HTTP/1.0\r\nContent-Type: a/b\r\nContent-Length: 2\r\n\r\nab",
    b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n",
    # a trusted proxy's scheme moves the default port; a chain of proxies; no Host at all
    b"GET /p HTTP/1.1\r\nHost: example.com\r\nX-Forwarded-Proto: https\r\n"
    b"X-Forwarded-For: 10.0.0.1, 127.0.0.1\r\n\r\n",
    b"GET /p HTTP/1.0\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: x\r\n\r\n",
]


@pytest.mark.parametrize("spec", BUILDERS, ids=["tcp", "unix-root", "proxied"])
def test_the_native_environ_is_the_python_environ(spec: dict) -> None:
    for raw in CORPUS + EXTRA:
        try:
            events = RequestParser().feed(raw)
        except ParseError:
            continue
        for request in (e for e in events if isinstance(e, Request)):
            for client in (("127.0.0.1", 4321), None):
                body = BodyBuffer(1 << 20, Spool(1 << 20, None), request.content_length).finish()
                python = EnvironBuilder(**spec)
                native = NativeEnvironBuilder.like(EnvironBuilder(**spec))
                assert type(native) is NativeEnvironBuilder
                expected = python.build(request, body, client)
                got = native.build(request, body, client)
                for env in (expected, got):
                    env.pop("wsgi.errors")
                assert got == expected, (raw, spec, client)


def test_one_native_environ_serves_many_threads() -> None:
    """--threads: the app threads of a listener share its builder (and its caches)."""
    builder = NativeEnvironBuilder.like(EnvironBuilder(server=("127.0.0.1", 80)))
    parser = RequestParser()
    requests = [
        parser.feed(b"GET /%d HTTP/1.1\r\nHost: h%d:%d\r\nX-H%d: v\r\n\r\n" % (i, i % 300, i, i))[0]
        for i in range(600)
    ]
    failures: list[BaseException] = []

    def work() -> None:
        try:
            for request in requests:
                env = builder.build(request, EMPTY_INPUT, ("127.0.0.1", 1))
                assert env["PATH_INFO"] == request.path.decode()
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    workers = [threading.Thread(target=work) for _ in range(8)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not failures, failures


class Recorder:
    """An Output that records what a response writes (never backlogged)."""

    zero_copy = False
    backlogged = False

    def __init__(self) -> None:
        self.data = b""

    def send(self, data: bytes) -> None:
        self.data += data

    def sendfile(self, fd: int, offset: int, count: int | None) -> int:  # pragma: no cover
        raise AssertionError("not used")

    def flush(self) -> None:
        pass


def _app(status: str, headers: list, body: object, write: bytes | None = None):
    def app(environ, start_response):
        w = start_response(status, list(headers))
        if write is not None:
            w(write)
        return body() if callable(body) else body

    return app


class ListBody(list):
    pass


APPS = [
    _app("200 OK", [("Content-Type", "text/plain")], [b"hello"]),
    _app("200 OK", [], (b"a", b"b", b"")),
    _app("200 OK", [], []),
    _app("201 ", [("X-A", "1"), ("x-a", "2")], [b"x"]),
    _app("200 OK", [("Content-Length", "5")], [b"hello"]),
    _app("200 OK", [("Content-Length", "9")], [b"hello"]),  # shorter than its length: close after it
    _app("200 OK", [("Content-Length", "2")], [b"hello"]),  # longer: a 500
    _app("200 OK", [("Content-Length", "5"), ("content-length", "5")], [b"hello"]),
    _app("200 OK", [("Content-Length", "5"), ("content-length", "6")], [b"hello"]),
    _app("200 OK", [("Content-Length", "+5")], [b"hello"]),
    _app("200 OK", [("Connection", "Close")], [b"bye"]),
    _app("200 OK", [("Connection", "keep-alive, x")], [b"hi"]),
    _app("200 OK", [("Date", "yesterday"), ("Server", "other")], [b"hi"]),
    _app("204 No Content", [], []),
    _app("304 Not Modified", [("Content-Length", "10")], []),
    _app("199 Early", [], [b"x"]),
    _app("404 Not Found", [], [b"no"] * 3),
    _app("200 OK", [], [b"x" * 70000]),
    _app("200 OK", [], [b"a", "not bytes"]),
    _app("200 OK", [], [bytearray(b"ba")]),
    _app("200 OK", [], lambda: iter([b"gen", b"erator"])),
    _app("200 OK", [], ListBody([b"sub"])),
    _app("200 OK", [], [b"after write"], write=b"written "),
    _app("bad", [], [b"x"]),
    _app("200 OK", [("Transfer-Encoding", "chunked")], [b"x"]),
]
HEADS = [
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"HEAD / HTTP/1.0\r\n\r\n",
]
DATE = re.compile(rb"Date: [^\r]*\r\n")


@pytest.mark.parametrize("keep_alive", [True, False])
def test_the_native_response_is_the_python_response(keep_alive: bool) -> None:
    for raw in HEADS:
        request = RequestParser().feed(raw)[0]
        for app in APPS:
            seen = []
            for start in (start_wsgi, start_wsgi_native):
                out = Recorder()
                environ = EnvironBuilder(server=("127.0.0.1", 80)).build(request, EMPTY_INPUT, None)
                outcome = start(app, environ, request, out, keep_alive)
                seen.append((DATE.sub(b"Date: -\r\n", out.data), outcome))
            assert seen[1] == seen[0], (raw, app)


def test_the_native_date_line_is_the_python_one() -> None:
    out = Recorder()
    request = RequestParser().feed(HEADS[0])[0]
    environ = EnvironBuilder(server=("127.0.0.1", 80)).build(request, EMPTY_INPUT, None)
    for _ in range(3):  # a second may turn between the two: one of three tries is enough
        start_wsgi_native(APPS[0], environ, request, out, True)
        python = simple_response(200)
        if DATE.findall(out.data)[-1] == DATE.findall(python)[0]:
            return
    raise AssertionError((out.data, python))


def test_auto_picks_native_and_native_without_the_extension_is_a_config_error() -> None:
    assert choose("auto") == "native"
    assert choose("python") == "python"
    blocked = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'refork._native': raise ImportError('blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from refork.serving.wsgi.choice import choose\n"
        "assert choose('auto') == 'python'\n"
        "from refork.cli import main\n"
        "sys.exit(main(['--wsgi-loop', 'native', 'apps.procs:app']))\n"
    )
    cmd = [sys.executable, "-c", blocked]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "refork._native is not built" in lines[0], out.stderr


def _get(port: int, path: str = "/") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _tasks(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def _threads(threads: int) -> int:
    """A native worker's threads: the loop's; with a pool, the engine's I/O thread and the app threads."""
    return 1 if threads == 1 else 2 + threads


@pytest.mark.parametrize("threads", [1, 4])
def test_native_worker_threads_and_none_in_the_mold(start_server, threads: int) -> None:
    server = start_server("--wsgi-loop", "native", "--threads", str(threads), workers=1)
    status, body = server.get("/")
    assert status == 200
    engine = "engine" if threads == 1 else f"engine, {threads} app threads"
    assert f"WSGI loop: native ({engine})" in server.log()
    pid = int(body.split()[0])  # (its threads start as it serves: count them once all are up)
    server.wait_for(lambda: _tasks(pid) == _threads(threads), what=f"{_threads(threads)} threads")
    molds = [p["pid"] for p in server.status()["processes"] if p["role"] == "mold"]
    for mold in molds:
        assert _tasks(mold) == 1


@pytest.mark.parametrize(
    ("args", "interval", "logged"),
    [
        (["--threads", "4"], 0.005, "(engine, 4 app threads)"),  # the interpreter's
        (["--threads", "4", "--switch-interval", "0.02"], 0.02, "4 app threads; GIL switch interval 20 ms)"),
        (["--threads", "1", "--switch-interval", "0.1", "--wsgi-loop", "python"], 0.1, "python (GIL switch"),
    ],
)
def test_switch_interval(start_server, args: list[str], interval: float, logged: str) -> None:
    server = start_server(*args, workers=1)
    status, body = server.get("/switch")
    assert status == 200 and float(body) == pytest.approx(interval)
    assert logged in server.log()
    status, _ = server.get("/")
    assert status == 200


def test_a_bad_switch_interval_is_one_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "refork", "--switch-interval", "0", "apps.procs:app"],
        capture_output=True, text=True, cwd=ROOT / "tests", timeout=30,
    )  # fmt: skip
    assert run.returncode == 2
    expected = '--switch-interval must be a number of seconds > 0 or "default", got "0"'
    assert run.stderr.strip().splitlines()[-1].endswith(expected)


@pytest.mark.parametrize("threads", [1, 2])
def test_promote_under_load_then_serve_from_the_new_generation(start_server, threads: int) -> None:
    """One app thread: the engine; two: the pool engine, whose I/O thread and app threads are
    joined at the safe point (the connections are the parent's after the fork)."""
    server = start_server("--wsgi-loop", "native", "--threads", str(threads), workers=2)
    before = {w["pid"] for w in server.workers()}
    stop = threading.Event()
    failures: list[BaseException] = []
    served = [0]

    def hammer() -> None:
        while not stop.is_set():
            try:
                status, _ = _get(server.port)
                assert status == 200
                served[0] += 1
            except BaseException as e:  # noqa: BLE001 - reported below
                failures.append(e)
                return

    clients = [threading.Thread(target=hammer) for _ in range(4)]
    for t in clients:
        t.start()
    try:
        server.wait_for(lambda: served[0] >= 20 or failures, what="the clients under way")
        server.signal(signal.SIGUSR2)
        server.wait_for(lambda: server.one_generation(2) == 1, what="a promoted generation")
        promoted = served[0]
        server.wait_for(lambda: served[0] >= promoted + 20 or failures, what="requests to the new generation")
    finally:
        stop.set()
        for t in clients:
            t.join()
    assert not failures, failures
    assert served[0] > 0
    for _ in range(5):
        pid = server.serving_pid()
        assert pid not in before
        assert any(w["pid"] == pid and w["generation"] == 1 for w in server.workers())
        server.wait_for(lambda pid=pid: _tasks(pid) == _threads(threads), what="the worker's threads")
