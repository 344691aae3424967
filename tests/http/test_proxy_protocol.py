"""The PROXY protocol (--proxy-protocol, --proxy-allow-from) behind a real haproxy, on every path.

haproxy (Debian's package, installed by the test when missing) forwards TCP to refork with
`send-proxy` (v1) and `send-proxy-v2`. The client connects from 127.0.0.2 while haproxy connects
to refork from 127.0.0.1: the app must see 127.0.0.2 and the client's own port (REMOTE_ADDR /
REMOTE_PORT, scope["client"]), and so must the access log's `h`, for every request of a kept-alive
connection; on a TLS listener the header comes before the TLS handshake (haproxy passes TLS
through). On an HTTP/2 path the client speaks HTTP/2: the header, then the preface (or the TLS
handshake, ALPN h2), then requests on streams. Sent by hand: a connection without a header is
served as it came (gunicorn's rule), a malformed header gets 400 and a header from a peer not
allowed 403, then the connection closes.
The parsers (Python and Rust) read one table of vectors (tests/support/proxy_vectors.py).
"""

from __future__ import annotations

import select
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest
from conftest import free_port, read_to_end
from support.certs import Certs
from support.h2client import PREFACE, H2Client
from support.proxy_vectors import SIG, VECTORS, v2
from support.request_paths import OVER_TLS, PATHS, every_path, flags, http2, over_cleartext_only
from support.request_paths import tls as tls_context
from support.services import ensure_installed

from refork._native import parse_proxy
from refork.http.proxy_protocol import (
    INCOMPLETE,
    NOT_PROXY,
    ProxyError,
    ProxyForbidden,
    ProxyHeader,
    ProxyPolicy,
    parse,
)

CLIENT = "127.0.0.2"  # the client's address; haproxy and the direct tests' allowed peer are 127.0.0.1


# -- the parsers ---------------------------------------------------------------------------------


def _python(data: bytes, mode: str) -> object:
    try:
        verdict = parse(data, mode)
    except ProxyError:
        return "ERROR"
    if verdict is INCOMPLETE or verdict is NOT_PROXY:
        return repr(verdict)
    assert isinstance(verdict, ProxyHeader)
    return (verdict.protocol, verdict.length, verdict.client, verdict.server)


def _rust(data: bytes, mode: str) -> object:
    try:
        verdict = parse_proxy(data, mode)
    except ValueError:
        return "ERROR"
    return verdict


@pytest.mark.parametrize("parser", [_python, _rust], ids=["python", "rust"])
@pytest.mark.parametrize("name, data, mode, expected", VECTORS, ids=[v[0] for v in VECTORS])
def test_vectors(parser, name, data, mode, expected):
    assert parser(data, mode) == expected


def test_every_prefix_of_a_header_is_incomplete():
    for header in (b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n", v2(1, 0x11, bytes(12))):
        for n in range(1, len(header)):
            assert _python(header[:n], "auto") == _rust(header[:n], "auto") == "INCOMPLETE", n


def test_policy():
    policy = ProxyPolicy("auto", ["127.0.0.1", "10.0.0.0/8"])
    header = b"PROXY TCP4 192.0.2.7 10.0.0.1 1 2\r\n"
    assert isinstance(policy.check(header, "10.1.2.3"), ProxyHeader)
    assert isinstance(policy.check(header, None), ProxyHeader)  # a unix-socket peer always may
    assert policy.check(b"GET / HTTP/1.1\r\n", "192.0.2.1") is NOT_PROXY  # no header: anyone
    assert policy.check(b"PROX", "192.0.2.1") is INCOMPLETE  # not a header yet
    with pytest.raises(ProxyForbidden):
        policy.check(header, "192.0.2.1")
    with pytest.raises(ProxyForbidden):  # forbidden before malformed, as gunicorn checks
        policy.check(b"PROXY nonsense\r\n", "::ffff:192.0.2.1")
    with pytest.raises(ProxyError) as e:
        policy.check(b"PROXY nonsense\r\n", "::ffff:10.0.0.1")
    assert e.value.status == 400
    assert ProxyPolicy("auto", ["*"]).allowed("203.0.113.9")


# -- haproxy in front of a server ------------------------------------------------------------------


@pytest.fixture(scope="session")
def haproxy_bin() -> str:
    ensure_installed(shutil.which("haproxy") is not None, "haproxy")
    path = shutil.which("haproxy")
    assert path
    return path


class Haproxy:
    """haproxy -db with two TCP frontends to one backend: `v1` (send-proxy) and `v2` (send-proxy-v2)."""

    def __init__(self, binary: str, tmp, backend_port: int) -> None:
        self.ports = {"v1": free_port(), "v2": free_port()}
        lines = ["global", "  maxconn 100", "defaults", "  mode tcp", "  timeout connect 5s",
                 "  timeout client 30s", "  timeout server 30s"]  # fmt: skip
        for version, port in self.ports.items():
            send = "send-proxy" if version == "v1" else "send-proxy-v2"
            lines += [f"listen {version}", f"  bind 127.0.0.1:{port}",
                      f"  server refork 127.0.0.1:{backend_port} {send}"]  # fmt: skip
        config = tmp / f"haproxy-{backend_port}.cfg"
        config.write_text("\n".join(lines) + "\n")
        self.proc = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)  # fmt: skip
        deadline = time.monotonic() + 20
        for port in self.ports.values():
            while True:
                assert self.proc.poll() is None, self.proc.stderr.read() if self.proc.stderr else ""
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, "haproxy did not start"
                    time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def haproxy(haproxy_bin, tmp_path):
    started: list[Haproxy] = []

    def start(backend_port: int) -> Haproxy:
        started.append(Haproxy(haproxy_bin, tmp_path, backend_port))
        return started[-1]

    yield start
    for proxy in started:
        proxy.stop()


def _connect(port: int, source: str = CLIENT, tls: ssl.SSLContext | None = None) -> socket.socket:
    sock = socket.socket()
    sock.settimeout(10)
    # (the loops below close thousands of connections a second first: their ports sit in
    # TIME_WAIT, and a bind to port 0 without SO_REUSEADDR may find none free)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return tls.wrap_socket(sock, server_hostname="127.0.0.1") if tls is not None else sock


def _more(sock: socket.socket, so_far: bytes) -> bytes:
    chunk = sock.recv(65536)
    assert chunk, f"the connection closed before the whole answer (got {so_far!r})"
    return chunk


def _speaking(path: str, sock: socket.socket) -> socket.socket | H2Client:
    """The connection as the path's clients speak on it: over HTTP/2, an H2Client whose preface
    follows what was sent on `sock` (a PROXY header)."""
    return H2Client(sock.getpeername()[1], timeout=10, sock=sock) if http2(path) else sock


def _peer(conn: socket.socket | H2Client, close: bool = False) -> tuple[str, int, str]:
    """GET /peer on an open connection (or a stream of an HTTP/2 one): (address, port, scheme) as
    the app saw them."""
    if isinstance(conn, H2Client):
        status, body = conn.request("GET", "/peer")
        assert status == 200, body
        address, port, scheme = body.decode().split()
        return address, int(port), scheme
    connection = "close" if close else "keep-alive"
    conn.sendall(f"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: {connection}\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += _more(conn, data)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    length = int(fields.get(b"Content-Length") or fields[b"content-length"])
    while len(body) < length:
        body += _more(conn, data + body)
    address, port, scheme = body.decode().split()
    return address, int(port), scheme


def _wait_lines(path, count: int) -> list[str]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines
        time.sleep(0.05)
    raise AssertionError(f"the access log has not {count} lines")


@over_cleartext_only("haproxy passing TLS through after the header: test_tls_after_the_header")
def test_behind_haproxy(path, start_server, haproxy, tmp_path):
    args, app = flags(path, "apps.access_apps")
    log = tmp_path / "access.log"
    server = start_server(*args, "--proxy-protocol", "--access-logfile", str(log), "--access-logformat",
                          "%(h)s %(U)s", app=app, workers=1)  # fmt: skip
    proxy = haproxy(server.port)
    h2 = http2(path)
    for version in ("v1", "v2"):
        with _connect(proxy.ports[version]) as sock:
            port = sock.getsockname()[1]
            conn = _speaking(path, sock)  # (over HTTP/2: haproxy's header, then the preface)
            assert _peer(conn) == (CLIENT, port, "http")
            assert _peer(conn, close=True) == (CLIENT, port, "http"), "the second request of the connection"
    # by hand, from 127.0.0.1 (allowed) and 127.0.0.2 (not allowed: the default is 127.0.0.1, ::1)
    with _connect(server.port, "127.0.0.1") as sock:  # no header: the peer's address
        assert _peer(_speaking(path, sock), close=True) == ("127.0.0.1", sock.getsockname()[1], "http")
    with _connect(server.port, "127.0.0.1") as sock:  # v2 LOCAL (haproxy's health checks): the peer's
        sock.sendall(v2(0, 0, b""))
        assert _peer(_speaking(path, sock), close=True) == ("127.0.0.1", sock.getsockname()[1], "http")
    with _connect(server.port, "127.0.0.1") as sock:  # a header in pieces
        sock.sendall(b"PROXY TCP4 198.51.")
        time.sleep(0.05)  # (a pause so that the pieces arrive apart: what is tested, not a wait)
        sock.sendall(b"100.9 127.0.0.1 4711 80\r\n")
        assert _peer(_speaking(path, sock), close=True) == ("198.51.100.9", 4711, "http")
    # a refused header is answered before any request is read: HTTP/1.1, whatever the client speaks
    request = PREFACE if h2 else b"GET /peer HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(server.port, "127.0.0.1") as sock:  # malformed: 400, closed
        sock.sendall(b"PROXY TCP4 198.51.100 127.0.0.1 4711 80\r\n" + request)
        assert read_to_end(sock).startswith(b"HTTP/1.1 400 ")
    with _connect(server.port, CLIENT) as sock:  # from a peer not allowed: 403, closed
        sock.sendall(b"PROXY TCP4 198.51.100.9 127.0.0.1 4711 80\r\n" + request)
        assert read_to_end(sock).startswith(b"HTTP/1.1 403 ")
    lines = _wait_lines(log, 7)
    # the access log's h: the client the header named (app threads may log two requests in
    # either order, so the lines are compared as a multiset)
    expected = [f"{CLIENT} /peer"] * 4 + ["127.0.0.1 /peer"] * 2 + ["198.51.100.9 /peer"]
    assert sorted(lines[:7]) == sorted(expected), lines
    server.wait_for(lambda: "not in proxy_allow_ips (from 127.0.0.2)" in server.log(), what="the 403's line")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.mark.parametrize("path", ["python-1", "engine", "asyncio", "uvloop", "uvloop-h2"])
def test_tls_after_the_header(path, start_server, haproxy, certs):
    """haproxy passes TLS through: the header, then the client's handshake (ALPN h2 on an HTTP/2
    path), on a TLS listener."""
    interface, args = PATHS[path]
    server = start_server(*args, *certs.args(), "--proxy-protocol", "v2", app=f"apps.access_apps:{interface}",
                          workers=1)  # fmt: skip
    proxy = haproxy(server.port)
    context = certs.client_context(["h2"] if http2(path) else ["http/1.1"])
    with _connect(proxy.ports["v2"], tls=context) as sock:
        port = sock.getsockname()[1]
        conn = _speaking(path, sock)
        assert _peer(conn) == (CLIENT, port, "https")
        assert _peer(conn, close=True) == (CLIENT, port, "https")
    with _connect(server.port, "127.0.0.1", tls=context) as sock:  # TLS, no header
        assert _peer(_speaking(path, sock), close=True) == ("127.0.0.1", sock.getsockname()[1], "https")
    with _connect(server.port, "127.0.0.1") as sock:  # a bad header before TLS: closed, no answer
        sock.sendall(SIG + b"\x21\x11\x00\x04abcd")
        assert read_to_end(sock) == b""


def test_unix_socket_peers_may_send_a_header(start_server, tmp_path):
    path = str(tmp_path / "proxied.sock")
    server = start_server("-b", f"unix:{path}", "--proxy-protocol", "v1", app="apps.access_apps:wsgi",
                          workers=1)  # fmt: skip
    server.wait_for(lambda: socket.socket(socket.AF_UNIX).connect_ex(path) == 0, what="the unix listener")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(path)
        sock.sendall(b"PROXY TCP6 2001:db8::7 2001:db8::1 4711 80\r\n")
        assert _peer(sock, close=True) == ("2001:db8::7", 4711, "http")


# -- a load balancer's health checks and refused clients beside real traffic -----------------------

HEADER = b"PROXY TCP4 198.51.100.9 127.0.0.1 4711 80\r\n"
BAD = b"PROXY TCP4 198.51.100 127.0.0.1 4711 80\r\n"  # malformed: 400


def _to_end(sock: socket.socket) -> bytes:
    """Everything until the server closes; ConnectionResetError if it resets instead."""
    chunks = []
    while data := sock.recv(65536):
        chunks.append(data)
    return b"".join(chunks)


def _refused(path: str) -> tuple[bytes, bytes]:
    """(what a 400 starts with on this path, a request to send behind a header). Before a TLS
    handshake a refusal gets no answer: the client speaks TLS."""
    request = PREFACE if http2(path) else b"GET /peer HTTP/1.1\r\nHost: x\r\n\r\n"
    return (b"" if path in OVER_TLS else b"HTTP/1.1 400 "), request


def _health_checks(path: str, port: int) -> list[str]:
    """One round of what load balancers and refused clients do; what went wrong, if anything."""
    answer_400, _ = _refused(path)
    wrong: list[str] = []
    _connect(port, "127.0.0.1").close()  # a TCP health check: connect, close
    with _connect(port, "127.0.0.1") as sock:  # a header abandoned half-way
        sock.sendall(HEADER[:12])
    for source, header, answer in (("127.0.0.1", BAD, answer_400),
                                   ("127.0.0.2", HEADER, answer_400.replace(b"400", b"403"))):  # fmt: skip
        with _connect(port, source) as sock:
            sock.sendall(header)
            got = read_to_end(sock)
            if not got.startswith(answer) or (not answer and got):
                wrong.append(f"{header!r} from {source}: {got[:40]!r}")
    return wrong


@every_path
def test_health_checks_and_refusals_never_end_a_worker(path, start_server):
    """Connect-and-close, a header abandoned half-way, refused headers (400, 403; on TLS a close):
    the worker serves on (no exit, no restart) and a client beside them is answered every time."""
    args, app = flags(path, "apps.access_apps")
    server = start_server(*args, "--proxy-protocol", "auto", app=app, workers=1)
    pids = [w["pid"] for w in server.workers()]
    tls = tls_context(path)
    failures: list[str] = []
    served = 0
    stop = threading.Event()

    def bystander() -> None:  # a request every 50 ms: the worker is idle in between, as mostly
        nonlocal served
        while not stop.wait(0.05):
            try:
                sock = _connect(server.port, "127.0.0.1")
                sock.sendall(HEADER)
                if tls is not None:
                    sock = tls.wrap_socket(sock, server_hostname="127.0.0.1")
                with sock:
                    peer = _peer(_speaking(path, sock), close=True)
                assert peer == ("198.51.100.9", 4711, "https" if tls else "http"), peer
                served += 1
            except (OSError, AssertionError) as e:
                failures.append(f"bystander: {e!r}")

    thread = threading.Thread(target=bystander)
    thread.start()
    until = time.monotonic() + 2
    try:
        while time.monotonic() < until:
            failures += _health_checks(path, server.port)
    finally:
        stop.set()
        thread.join(30)
    assert not failures, failures[:5]
    assert served
    assert [w["pid"] for w in server.workers()] == pids, server.log()
    assert " exited with code " not in server.log(), server.log()


@every_path
def test_a_refusal_closes_without_a_reset(path, start_server):
    """A refused client that wrote on (a request behind the header, or writes after the answer)
    reads the answer and the end of the connection, not a reset: the server lingers."""
    args, app = flags(path, "apps.access_apps")
    server = start_server(*args, "--proxy-protocol", "auto", app=app, workers=1)
    answer, request = _refused(path)
    for _ in range(20):
        with _connect(server.port, "127.0.0.1") as sock:  # the request unread when refused
            sock.sendall(BAD + request)
            got = _to_end(sock)
            assert got.startswith(answer) and (answer or not got), got
        with _connect(server.port, "127.0.0.1") as sock:  # writes once the answer is there
            sock.sendall(BAD)
            select.select([sock], [], [], 10)
            sock.sendall(request)
            got = _to_end(sock)
            assert got.startswith(answer) and (answer or not got), got
