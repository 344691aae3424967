"""HTTP/2 end to end: real servers, real clients (curl --http2 and --http2-prior-knowledge, httpx
with http2=True, a raw h2 client for resets and GOAWAY), over TLS (ALPN) and h2c, for ASGI (asyncio,
uvloop) and WSGI (the Python loop with app threads; the native engine handing h2c over to the
Python loop, whose one app thread is the loop's)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import urllib.request

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import httpx
import pytest
from conftest import free_port, read_to_end, run_cli
from hyperframe.frame import ContinuationFrame, DataFrame, GoAwayFrame, HeadersFrame
from support import paths
from support.certs import Certs
from support.h2client import PREFACE, frames
from support.waits import unread

from refork.http.h2 import ANY_STREAM

APP = "apps.h2_apps:app"
WSGI_APP = "apps.h2_apps:wsgi_app"
# how a server is started: its app and loop flags; the WSGI ones from the same paths (apps/h2_apps.py)
SERVERS = {
    "asgi-asyncio": (APP, ("--loop", "asyncio")),
    "asgi-uvloop": (APP, ("--loop", "uvloop")),
    "wsgi-python-threads": (WSGI_APP, ("--wsgi-loop", "python", "--threads", "4")),
    "wsgi-native-1-thread": (WSGI_APP, ("--wsgi-loop", "native", "--threads", "1")),
}
ASGI = [name for name in SERVERS if name.startswith("asgi")]
WSGI = [name for name in SERVERS if name.startswith("wsgi")]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("h2certs"))


@pytest.fixture(params=list(SERVERS))
def loop(request: pytest.FixtureRequest) -> tuple[str, tuple[str, ...]]:
    """The app and the loop flags of a server (every interface and loop)."""
    return SERVERS[request.param]


@pytest.fixture(params=ASGI)
def asgi_loop(request: pytest.FixtureRequest) -> tuple[str, tuple[str, ...]]:
    """What ASGI has only (http.disconnect, trailers, pathsend)."""
    return SERVERS[request.param]


def _curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", "--max-time", "20", *args], capture_output=True, text=True,
                          timeout=30)  # fmt: skip


def _h2c(start_server, loop, *args: str, env: dict[str, str] | None = None, workers: int = 1):
    app, flags = loop
    return start_server(*flags, "--http-protocols", "h2c,h1", *args, app=app, workers=workers,
                        env=env)  # fmt: skip


# -- curl ---------------------------------------------------------------------------------------


def test_curl_prior_knowledge_on_h2c_and_http11_on_the_same_port(start_server, loop):
    server = _h2c(start_server, loop, "--access-logfile", "-")
    url = f"http://127.0.0.1:{server.port}/hello?x=1"
    out = _curl("--http2-prior-knowledge", "-w", "\n%{http_version}", url)
    body, version = out.stdout.rsplit("\n", 1)
    assert version == "2", out.stderr
    info = json.loads(body)
    assert (info["http_version"], info["scheme"], info["path"]) == ("2", "http", "/hello")
    assert info["host"] == f"127.0.0.1:{server.port}"  # from :authority
    body, version = _curl("--http1.1", "-w", "\n%{http_version}", url).stdout.rsplit("\n", 1)
    assert version == "1.1" and json.loads(body)["http_version"] == "1.1"
    line = 'GET /hello?x=1 HTTP/2.0" 200'
    server.wait_for(lambda: line in server.log(), what="an HTTP/2.0 access-log line")


def test_h2c_is_off_unless_asked_for(start_server, loop):
    server = start_server(*loop[1], app=loop[0], workers=1)
    out = _curl("--http2-prior-knowledge", f"http://127.0.0.1:{server.port}/")
    assert out.returncode != 0  # the preface is not HTTP/1.1: refused with 400, the h2 client fails
    assert _curl("-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{server.port}/").stdout == "200"


def test_curl_http2_over_tls_by_alpn(start_server, certs, loop):
    server = start_server(*loop[1], *certs.args(), app=loop[0], workers=1)  # the default: h2,h1
    url = f"https://127.0.0.1:{server.port}/tls"
    out = _curl("--http2", "--cacert", str(certs.ca_pem), "-w", "\n%{http_version}", url)
    body, version = out.stdout.rsplit("\n", 1)
    assert version == "2", out.stderr
    assert json.loads(body)["scheme"] == "https"
    out = _curl("--http1.1", "--cacert", str(certs.ca_pem), "-w", "\n%{http_version}", url)
    assert out.stdout.rsplit("\n", 1)[1] == "1.1"


def test_h1_only_turns_alpn_h2_off(start_server, certs, loop):
    server = start_server(*loop[1], "--http-protocols", "h1", *certs.args(), app=loop[0], workers=1)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with certs.client_context(["h2", "http/1.1"]).wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        assert sock.selected_alpn_protocol() == "http/1.1"


def test_curl_trailers_pathsend_and_an_app_error(start_server, asgi_loop):
    server = _h2c(start_server, asgi_loop)
    base = f"http://127.0.0.1:{server.port}"
    out = _curl("--http2-prior-knowledge", "-i", f"{base}/trailers")
    assert "with trailers" in out.stdout and "x-checksum: abc" in out.stdout
    out = _curl("--http2-prior-knowledge", f"{base}/pathsend")
    assert out.stdout == paths.TESTS.joinpath("apps", "h2_apps.py").read_text()
    out = _curl("--http2-prior-knowledge", "-w", "%{http_code}", "-o", "/dev/null", f"{base}/error")
    assert out.stdout == "500"
    assert "boom (expected by the test)" in server.log()


# -- httpx --------------------------------------------------------------------------------------


def test_httpx_many_streams_on_one_tls_connection(start_server, certs, loop):
    server = start_server(*loop[1], *certs.args(), app=loop[0], workers=1)
    base = f"https://127.0.0.1:{server.port}"
    upload = os.urandom(3 << 20)

    async def run() -> None:
        async with httpx.AsyncClient(http2=True, verify=certs.client_context(["h2"]), timeout=30) as client:
            responses = await asyncio.gather(*[client.get(f"{base}/r{i}") for i in range(50)])
            assert {r.http_version for r in responses} == {"HTTP/2"}
            assert [json.loads(r.content)["path"] for r in responses] == [f"/r{i}" for i in range(50)]
            assert len({json.loads(r.content)["pid"] for r in responses}) == 1  # one connection
            echo, big = await asyncio.gather(client.post(f"{base}/echo", content=upload),
                                             client.get(f"{base}/big?{5 << 20}"))  # fmt: skip
            assert echo.text == f"{len(upload)} {hashlib.sha256(upload).hexdigest()}"
            assert len(big.content) == 5 << 20

    asyncio.run(run())


def test_body_limit_is_413_on_its_stream(start_server, loop):
    server = _h2c(start_server, loop, "--limit-request-body", "1000")
    with httpx.Client(http1=False, http2=True, timeout=20) as client:
        base = f"http://127.0.0.1:{server.port}"
        assert client.post(f"{base}/echo", content=b"x" * 2000).status_code == 413
        assert client.post(f"{base}/echo", content=b"x" * 999).text.startswith("999 ")


# -- a raw h2 client: resets, GOAWAY --------------------------------------------------------------


class RawClient:
    """An h2 client over a plain socket (h2c prior knowledge)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def request(self, sid: int, path: str, end: bool = True) -> None:
        self.conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                     (":authority", "localhost")], end_stream=end)  # fmt: skip
        self.flush()

    def events(self) -> list[h2.events.Event]:
        data = self.sock.recv(65536)
        if not data:
            return [h2.events.ConnectionTerminated()]
        out = self.conn.receive_data(data)
        self.flush()
        return out

    def until(self, predicate, limit: int = 200) -> list[h2.events.Event]:
        seen: list[h2.events.Event] = []
        for _ in range(limit):
            seen += self.events()
            if predicate(seen):
                return seen
        raise AssertionError(f"not seen: {seen}")

    def close(self) -> None:
        self.sock.close()


def test_rst_stream_is_http_disconnect_to_the_app(start_server, asgi_loop, tmp_path):
    events = tmp_path / "events"
    server = _h2c(start_server, asgi_loop, env={"H2_EVENTS": str(events)})
    client = RawClient(server.port)
    try:
        client.request(1, "/wait-disconnect?one", end=False)
        server.wait_for(lambda: events.exists() and "waiting one" in events.read_text(), what="the app")
        client.conn.reset_stream(1, error_code=8)
        client.flush()
        server.wait_for(lambda: "disconnect one" in events.read_text(), what="http.disconnect")
        client.request(3, "/after")  # the connection goes on
        seen = client.until(lambda s: any(type(e) is h2.events.StreamEnded and e.stream_id == 3 for e in s))
        assert any(isinstance(e, h2.events.ResponseReceived) and e.stream_id == 3 for e in seen)
    finally:
        client.close()


def test_graceful_stop_sends_goaway_and_finishes_the_stream(start_server, loop, tmp_path):
    events = tmp_path / "events"
    server = _h2c(start_server, loop, "--graceful-timeout", "20", env={"H2_EVENTS": str(events)})
    client = RawClient(server.port)
    try:
        client.request(1, "/slow?1.5")
        server.wait_for(lambda: events.exists() and "slow" in events.read_text(), what="the app")
        server.signal(signal.SIGTERM)
        # read to the end as frames (h2's own client takes nothing after a GOAWAY)
        data = b""
        while chunk := client.sock.recv(65536):
            data += chunk
        sent = list(frames(data))
        goaway = [f for f in sent if isinstance(f, GoAwayFrame)]
        assert _graceful(goaway) == [ANY_STREAM, 1]  # every stream, then (a round trip later) the last
        body = [f for f in sent if isinstance(f, DataFrame) and f.stream_id == 1]
        assert b"".join(f.data for f in body) == b"slow done" and "END_STREAM" in body[-1].flags
        if not _app_on_loop_thread(loop):  # (there the GOAWAY goes out when the app call returns)
            assert sent.index(goaway[0]) < sent.index(body[0])  # GOAWAY first, then the answer
    finally:
        client.close()


def _graceful(goaways: list[GoAwayFrame]) -> list[int]:
    """The last stream ids of a graceful end's GOAWAY frames (all NO_ERROR)."""
    assert {f.error_code for f in goaways} == {0}, goaways
    return [f.last_stream_id for f in goaways]


def _app_on_loop_thread(loop) -> bool:
    """WSGI with one thread: the app runs on the loop's thread, which answers nothing meanwhile."""
    return loop[0] == WSGI_APP and loop[1][-1] == "1"


def test_rapid_reset_gets_goaway_over_the_wire(start_server, loop):
    server = _h2c(start_server, loop)
    client = RawClient(server.port)
    try:
        for i in range(400):
            sid = 1 + 2 * i
            client.conn.send_headers(sid, [(":method", "GET"), (":path", "/"), (":scheme", "http"),
                                           (":authority", "x")], end_stream=True)  # fmt: skip
            client.conn.reset_stream(sid)
        client.flush()
        seen = client.until(lambda s: any(isinstance(e, h2.events.ConnectionTerminated) for e in s))
        (goaway,) = [e for e in seen if isinstance(e, h2.events.ConnectionTerminated)][:1]
        assert goaway.error_code == 11  # ENHANCE_YOUR_CALM
    finally:
        client.close()
    # the worker is fine: the next connection is served
    assert _curl("--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}",
                 f"http://127.0.0.1:{server.port}/").stdout == "200"  # fmt: skip


def test_a_stalled_body_gets_408_on_its_stream_only(start_server, loop):
    server = _h2c(start_server, loop, "--body-timeout", "1")
    client = RawClient(server.port)
    try:
        client.request(1, "/echo", end=False)  # a head, and a body that never comes
        client.request(3, "/fine")
        seen = client.until(lambda s: any(isinstance(e, h2.events.ResponseReceived) and e.stream_id == 1
                                          for e in s))  # fmt: skip
        status = {e.stream_id: dict(e.headers)[b":status"] for e in seen
                  if isinstance(e, h2.events.ResponseReceived)}  # fmt: skip
        assert status == {3: b"200", 1: b"408"}
    finally:
        client.close()


def test_a_window_that_stays_shut_costs_only_its_stream(start_server, loop):
    server = _h2c(start_server, loop, "--write-timeout", "1")
    client = RawClient(server.port)
    try:
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        client.flush()
        client.request(1, "/big?100000")  # it may send nothing: the client never opens the window
        seen = client.until(lambda s: any(type(e) is h2.events.StreamReset and e.stream_id == 1 for e in s))
        assert [e.error_code for e in seen if isinstance(e, h2.events.StreamReset)] == [8]  # CANCEL
        client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535})
        client.request(3, "/fine")  # the connection goes on
        client.until(lambda s: any(type(e) is h2.events.StreamEnded and e.stream_id == 3 for e in s))
    finally:
        client.close()
    server.wait_for(lambda: "write timeout" in server.log(), what="the write-timeout line")


def test_health_checks_are_answered_on_a_stream_without_the_app(start_server, loop):
    server = _h2c(start_server, loop, "--health-path", "/_refork/health", "--access-logfile", "-")
    base = f"http://127.0.0.1:{server.port}"
    server.wait_for(lambda: _curl("--http2-prior-knowledge", f"{base}/_refork/health/ready").stdout == "ok\n",
                    what="readiness over HTTP/2")  # fmt: skip
    _curl("--http2-prior-knowledge", f"{base}/after")
    server.wait_for(lambda: "GET /after HTTP/2.0" in server.log(), what="the app's line")
    assert "/_refork/health" not in server.log()  # not logged


def test_max_requests_ends_the_connection_with_goaway(start_server, loop):
    server = _h2c(start_server, loop, "--max-requests", "3")
    client = RawClient(server.port)
    try:
        for sid in (1, 3, 5):
            client.request(sid, f"/r{sid}")
        data = b""
        while chunk := client.sock.recv(65536):  # to the end: the worker closes it after its GOAWAY
            data += chunk
    finally:
        client.close()
    sent = list(frames(data))
    ended = {f.stream_id for f in sent if isinstance(f, DataFrame) and "END_STREAM" in f.flags}
    assert ended == {1, 3, 5}
    goaway = [f for f in sent if isinstance(f, GoAwayFrame)]
    assert _graceful(goaway) == [ANY_STREAM, 5]


def test_bodies_held_for_apps_count_against_max_request_memory(start_server, loop):
    """Streams whose apps do not read yet fill --max-request-memory: nothing is lost (ASGI: reading
    waits; WSGI: the bytes are charged, each stream held to its window)."""
    server = _h2c(start_server, loop, "--max-request-memory", "64K")
    client = RawClient(server.port)
    bodies = {1: 60000, 3: 60000, 5: 60000, 7: 60000, 9: 200000}  # four slow apps, one echo
    try:
        for sid in bodies:
            path = "/echo" if sid == 9 else "/slow?0.3"
            client.conn.send_headers(sid, [(":method", "POST"), (":path", path), (":scheme", "http"),
                                           (":authority", "x")])  # fmt: skip
        client.flush()
        left, answers = dict(bodies), {}
        while len(answers) < len(bodies):
            for sid, n in list(left.items()):  # as much as the windows let through
                try:
                    size = min(n, client.conn.local_flow_control_window(sid), 16384)
                    if size:
                        client.conn.send_data(sid, b"b" * size, end_stream=n == size)
                except h2.exceptions.StreamClosedError:  # answered, and the rest of its body refused
                    size = n
                left[sid] = n - size
                if left[sid] == 0:
                    del left[sid]
            client.flush()
            for event in client.events():
                if isinstance(event, h2.events.DataReceived):
                    answers[event.stream_id] = answers.get(event.stream_id, b"") + event.data
                    client.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
    finally:
        client.close()
    assert [answers[sid] for sid in (1, 3, 5, 7)] == [b"slow done"] * 4
    assert answers[9].startswith(b"200000 ")


def test_a_header_block_without_room_in_max_request_memory_is_refused_from_its_first_bytes(
    start_server, loop
):
    """A header block counts against --max-request-memory from its first frame's first bytes: one
    whose first frame has come only in part when the budget has no room for it ends its connection
    at once (GOAWAY ENHANCE_YOUR_CALM), as one whose CONTINUATIONs do not fit does, however the
    client's bytes are cut; the block held before it is kept."""
    server = _h2c(start_server, loop, "--max-request-memory", "64K")
    held, late = RawClient(server.port), RawClient(server.port)
    try:
        for client in (held, late):  # (the server's SETTINGS: both speak HTTP/2 now)
            client.until(lambda seen: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in seen))
        block = HeadersFrame(1, b"x" * 16384).serialize()
        block += b"".join(ContinuationFrame(1, b"x" * n).serialize() for n in (16384, 16384, 10000))
        held.sock.sendall(block)  # 59,152 bytes of a block never ended
        port = held.sock.getsockname()[1]
        server.wait_for(lambda: unread(server.port, port) == 0, what="the held block read")
        late.sock.sendall(HeadersFrame(1, b"x" * 16384).serialize()[:8009])  # 8,000 bytes: 6,384 fit
        answer = list(frames(read_to_end(late.sock)))
    finally:
        held.close()
        late.close()
    assert [f.error_code for f in answer if isinstance(f, GoAwayFrame)] == [11]  # ENHANCE_YOUR_CALM
    assert "no room for more request heads" in server.log()


@pytest.mark.parametrize("kind", WSGI)
def test_a_reset_stream_ends_its_wsgi_app_call(start_server, kind):
    """A client that resets a stream while its app writes (here: waits on the shut window): the
    app's next write raises, its call ends (and is logged), the connection goes on."""
    server = _h2c(start_server, SERVERS[kind], "--access-logfile", "-")
    client = RawClient(server.port)
    try:
        client.request(1, "/big?10000000")  # far past the window: the app waits for the client
        client.until(lambda s: any(isinstance(e, h2.events.DataReceived) and e.stream_id == 1 for e in s))
        client.conn.reset_stream(1, error_code=8)
        client.flush()
        client.request(3, "/after")
        seen = client.until(lambda s: any(type(e) is h2.events.StreamEnded and e.stream_id == 3 for e in s))
        assert any(isinstance(e, h2.events.ResponseReceived) and e.stream_id == 3 for e in seen)
    finally:
        client.close()
    server.wait_for(lambda: "GET /big?10000000 HTTP/2.0\" 200" in server.log(), what="the reset call's line")
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("kind", WSGI)
def test_a_response_sent_before_its_request_body_came_goes_out_whole(start_server, kind):
    """An app that answers before reading the request's body, more than the client's window: the
    response is queued past the end of the app call, and the stream is reset (the rest of the body
    is not wanted) only once all of it went out."""
    server = _h2c(start_server, SERVERS[kind])
    client = RawClient(server.port)
    try:
        client.request(1, "/big?300000", end=False)  # a body begun (its window's worth), never ended
        for _ in range(4):
            client.conn.send_data(1, b"x" * 16383)
        client.conn.send_data(1, b"xxx")
        client.flush()
        body = 0
        for _ in range(400):
            for event in client.events():
                if isinstance(event, h2.events.DataReceived):
                    body += len(event.data)
                    client.conn.acknowledge_received_data(event.flow_controlled_length, 1)
                    client.flush()
            if body >= 300000:
                break
        assert body == 300000
    finally:
        client.close()


@pytest.mark.parametrize("kind", WSGI)
def test_a_refork_ends_http2_connections_with_goaway_after_their_streams(start_server, kind, tmp_path):
    """A refork (USR2): the worker's app call in flight finishes (the safe point waits for it), and
    the generation it leaves sends its connections GOAWAY naming the streams it took."""
    events = tmp_path / "events"
    server = _h2c(start_server, SERVERS[kind], "--graceful-timeout", "20", env={"H2_EVENTS": str(events)})
    client = RawClient(server.port)
    try:
        client.request(1, "/slow?1")
        server.wait_for(lambda: events.exists() and "slow" in events.read_text(), what="the app")
        server.signal(signal.SIGUSR2)
        data = b""
        while chunk := client.sock.recv(65536):  # to the end: the old worker closes it after its GOAWAY
            data += chunk
    finally:
        client.close()
    sent = list(frames(data))
    body = [f for f in sent if isinstance(f, DataFrame) and f.stream_id == 1]
    assert b"".join(f.data for f in body) == b"slow done" and "END_STREAM" in body[-1].flags
    goaway = [f for f in sent if isinstance(f, GoAwayFrame)]
    assert _graceful(goaway) == [ANY_STREAM, 1]
    server.wait_for(lambda: server.status()["generation"] == 1, what="generation 1")


@pytest.mark.parametrize("threads", [1, 3])
def test_wsgi_threads_bound_the_streams_in_the_app(start_server, threads):
    """Each stream is one app call on the worker's app threads: never more than --threads at once;
    the streams beyond wait for a thread (and every one is answered)."""
    server = _h2c(start_server, (WSGI_APP, ("--wsgi-loop", "python", "--threads", str(threads))))
    client = RawClient(server.port)
    sids = list(range(1, 2 * 8, 2))
    try:
        for sid in sids:
            client.request(sid, "/concurrent")
        answers: dict[int, bytes] = {}
        ended: set[int] = set()
        while ended != set(sids):
            for event in client.events():
                if isinstance(event, h2.events.DataReceived):
                    answers[event.stream_id] = answers.get(event.stream_id, b"") + event.data
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
    finally:
        client.close()
    most = max(int(answer) for answer in answers.values())  # the most app calls at once, as seen
    assert most == threads, answers


def test_wsgi_environ_over_http2(start_server, certs):
    """What a WSGI app sees over HTTP/2: SERVER_PROTOCOL HTTP/2.0, the scheme, the host from
    :authority, and wsgi.input with the stream's body (read as it arrives)."""
    server = start_server("--wsgi-loop", "python", "--threads", "2", *certs.args(), app=WSGI_APP, workers=1)
    base = f"https://127.0.0.1:{server.port}"
    upload = os.urandom(1 << 20)  # past the stream's window: it opens as the app reads
    with httpx.Client(http2=True, verify=certs.client_context(["h2"]), timeout=30) as client:
        info = client.get(f"{base}/env").json()
        assert (info["server_protocol"], info["scheme"], info["host"]) == ("HTTP/2.0", "https",
                                                                           f"127.0.0.1:{server.port}")
        echo = client.post(f"{base}/echo", content=upload)
        assert echo.http_version == "HTTP/2"
        assert echo.text == f"{len(upload)} {hashlib.sha256(upload).hexdigest()}"
        chunked = client.post(f"{base}/echo", content=iter([upload[:1000], upload[1000:5000]]))
        assert chunked.text.startswith("5000 ")  # no content-length: read to the end of the stream


@pytest.mark.parametrize("kind", WSGI)
def test_wsgi_h2_over_tls_behind_a_proxy_header(start_server, certs, kind):
    """A PROXY header, then TLS with ALPN h2: HTTP/2, and the client the header names."""
    app, flags = SERVERS[kind]
    server = start_server(*flags, "--proxy-protocol", "v1", *certs.args(), app=app, workers=1)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    raw.sendall(b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 443\r\n")
    with certs.client_context(["h2"]).wrap_socket(raw, server_hostname="127.0.0.1") as sock:
        assert sock.selected_alpn_protocol() == "h2"
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.send_headers(1, [(":method", "GET"), (":path", "/env"), (":scheme", "https"),
                              (":authority", "localhost")], end_stream=True)  # fmt: skip
        sock.sendall(conn.data_to_send())
        body, ended = b"", False
        while not ended:
            data = sock.recv(65536)
            assert data, "closed before the answer"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    body += event.data
                ended = ended or isinstance(event, h2.events.StreamEnded)
            sock.sendall(conn.data_to_send())
    info = json.loads(body)
    assert (info["server_protocol"], info["scheme"], info["remote"]) == ("HTTP/2.0", "https", "203.0.113.7")


# -- metrics and status per protocol ------------------------------------------------------------


# (not on a one-thread WSGI worker: its app runs on the loop thread, so a reset sent while it runs
# is read once the stream has ended, and what is counted depends on the timing)
@pytest.mark.parametrize("kind", [*ASGI, "wsgi-python-threads"])
def test_metrics_and_status_count_http2_streams_resets_goaways_and_requests_by_protocol(start_server, kind):
    mport = free_port()
    server = _h2c(start_server, SERVERS[kind], "--metrics-bind", f"127.0.0.1:{mport}")
    client = RawClient(server.port)
    try:
        for sid in (1, 3):
            client.request(sid, f"/r{sid}")
        client.until(lambda s: sum(type(e) is h2.events.StreamEnded for e in s) == 2)
        client.request(5, "/slow?0.5")
        client.conn.reset_stream(5, error_code=8)  # CANCEL: one reset received
        client.flush()
        http11 = _curl("--http1.1", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{server.port}/")
        assert http11.stdout == "200"
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as bad:  # a zero WINDOW_UPDATE:
            bad.sendall(PREFACE + b"\0\0\0\x04\0\0\0\0\0" + b"\0\0\x04\x08\0\0\0\0\0" + b"\0\0\0\0")
            goaway = [f for f in frames(read_to_end(bad)) if isinstance(f, GoAwayFrame)]  # GOAWAY sent
        assert goaway and goaway[0].error_code == 1  # PROTOCOL_ERROR
        expected = {
            "refork_http2_connections 1",  # the client's, still open
            "refork_http2_streams_total 3",
            'refork_http2_resets_total{direction="received"} 1',
            "refork_http2_goaways_sent_total 1",
            'refork_protocol_requests_total{protocol="HTTP/2"} 3',
            'refork_protocol_requests_total{protocol="HTTP/1.1"} 1',
            'refork_worker_http2_connections{worker="0",generation="0"} 1',
        }

        def missing() -> set[str]:
            text = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read().decode()
            return expected - set(text.splitlines())

        server.wait_for(lambda: not missing(), what=f"the HTTP/2 metrics (missing: {missing()})")
        assert server.workers()[0]["http2"] == 1
        table = run_cli("status", "--control-socket", server.control).stdout.splitlines()
        header = next(line.split() for line in table if line.startswith("PID"))
        worker = next(line.split() for line in table if " worker 0 " in line)
        assert worker[header.index("H2") + 1] == "1", table  # (+1: "worker 0" is two words)
    finally:
        client.close()
    server.wait_for(lambda: server.workers()[0]["http2"] == 0, what="no HTTP/2 connection once it closed")
