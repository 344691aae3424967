"""TLS (--certfile & co.): real processes, certificates made here with trustme, real clients.

curl and openssl s_client are run for real; Python ssl clients do keep-alive, pipelining and big
bodies. Every test runs the WSGI loop (one thread and a pool) and the ASGI loop (asyncio and
uvloop) unless it is about the monitor only.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import trustme
from conftest import read_to_end, run_cli
from cryptography import x509
from support.certs import Certs
from support.waits import accept_queue, sender_blocked, wait_until

MODES = {
    "wsgi-1": ["--threads", "1"],
    "wsgi-4": ["--threads", "4"],
    "asgi-asyncio": ["--loop", "asyncio"],
    "asgi-uvloop": ["--loop", "uvloop"],
}
APPS = {"wsgi-1": "apps.tls_apps:wsgi", "wsgi-4": "apps.tls_apps:wsgi", "asgi-asyncio": "apps.tls_apps:asgi",
        "asgi-uvloop": "apps.tls_apps:asgi"}  # fmt: skip


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(params=list(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _start(start_server, certs: Certs, mode: str, *args: str, workers: int = 1):
    return start_server(*certs.args(), *MODES[mode], *args, app=APPS[mode], workers=workers)


def _curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["curl", "-sS", "--max-time", "20", *args], capture_output=True, text=True,
                          timeout=30)  # fmt: skip


def _tls_socket(certs: Certs, port: int) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=20)
    return certs.client_context().wrap_socket(raw, server_hostname="127.0.0.1")


def _read_response(sock: ssl.SSLSocket, buf: bytearray) -> bytes:
    """One Content-Length response off a TLS stream; what follows it stays in buf."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, f"closed before a response head: {bytes(buf)!r}"
        buf += data
    head, _, _ = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    end = len(head) + 4 + length
    while len(buf) < end:
        data = sock.recv(1 << 20)
        assert data, "closed in a response body"
        buf += data
    response = bytes(buf[:end])
    del buf[:end]
    return response


def _body(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[2]


# --------------------------------------------------------------------------------------------
# the basics: curl, openssl s_client, the scheme
# --------------------------------------------------------------------------------------------


def test_curl_sees_https_scheme(start_server, certs, mode):
    server = _start(start_server, certs, mode)
    done = _curl("--cacert", str(certs.ca_pem), f"https://127.0.0.1:{server.port}/hello")
    assert done.returncode == 0, done.stderr
    scheme, _, path = done.stdout.split()
    assert (scheme, path) == ("https", "/hello")  # wsgi.url_scheme / scope["scheme"]
    # X-Forwarded-Proto rules are unchanged: 127.0.0.1 is a trusted proxy by default (gunicorn's
    # --forwarded-allow-ips), so its header wins over the TLS of the hop, as it would over plain HTTP
    done = _curl("--cacert", str(certs.ca_pem), "-H", "X-Forwarded-Proto: http",
                 f"https://127.0.0.1:{server.port}/")  # fmt: skip
    assert done.stdout.split()[0] == "http"
    # plain HTTP to the TLS port is refused, and the server goes on
    plain = _curl(f"http://127.0.0.1:{server.port}/")
    assert plain.returncode != 0 or not plain.stdout.startswith("http ")
    again = _curl("--cacert", str(certs.ca_pem), f"https://127.0.0.1:{server.port}/again")
    assert again.returncode == 0 and again.stdout.split()[2] == "/again"
    assert "Traceback" not in server.log()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated")
@pytest.mark.parametrize("mode", ["wsgi-1", "asgi-uvloop"])
def test_openssl_s_client_alpn_and_versions(start_server, certs, mode):
    server = _start(start_server, certs, mode)
    for version, expect in (("-tls1_3", "TLSv1.3"), ("-tls1_2", "TLSv1.2")):
        done = subprocess.run(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", "-CAfile", str(certs.ca_pem),
             "-alpn", "http/1.1", version, "-quiet", "-verify_return_error"],
            input=b"GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", capture_output=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(b"HTTP/1.1 200"), done.stdout
        assert done.stdout.endswith(b"/s")
        brief = subprocess.run(
            ["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", "-CAfile", str(certs.ca_pem),
             "-alpn", "http/1.1", version],
            input=b"", capture_output=True, timeout=30,
        )  # fmt: skip
        text = brief.stdout.decode()
        assert f"New, {expect}, Cipher is" in text, text
        assert "ALPN protocol: http/1.1" in text, text
        assert "Verify return code: 0 (ok)" in text, text
    # TLS 1.1 is below the minimum: refused
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(certs.ca_pem))
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw, pytest.raises(ssl.SSLError):
        ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    assert "Traceback" not in server.log()


# --------------------------------------------------------------------------------------------
# HTTP/1.1 over TLS: keep-alive, pipelining, big bodies both ways
# --------------------------------------------------------------------------------------------


def test_keepalive_pipelining_and_large_bodies(start_server, certs, mode):
    server = _start(start_server, certs, mode)
    upload = os.urandom(3 << 20) + b"end"
    with _tls_socket(certs, server.port) as sock:
        assert sock.selected_alpn_protocol() == "http/1.1"
        buf = bytearray()
        # three pipelined requests in one write
        sock.sendall(b"".join(f"GET /p{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(3)))
        pids = set()
        for i in range(3):
            scheme, pid, path = _body(_read_response(sock, buf)).split()
            assert (scheme, path) == (b"https", f"/p{i}".encode())
            pids.add(pid)
        assert len(pids) == 1
        # a big upload on the same connection
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(upload) + upload)
        n, digest = _body(_read_response(sock, buf)).split()
        assert (int(n), digest.decode()) == (len(upload), hashlib.sha256(upload).hexdigest())
        # a big download, read slowly at first (the server's TLS writes block and resume)
        size = 8 << 20
        sock.sendall(b"GET /big?%d HTTP/1.1\r\nHost: x\r\n\r\n" % size)
        wait_until(lambda: sender_blocked(sock), what="the server's TLS writes blocked")
        body = _body(_read_response(sock, buf))
        assert len(body) == size and body[:256] == bytes(range(256))
        # and still the same connection afterwards
        sock.sendall(b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _body(_read_response(sock, buf)).split()[2] == b"/last"
    # http.client over one kept-alive HTTPS connection
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=certs.client_context(), timeout=20)
    try:
        for i in range(5):
            conn.request("GET", f"/k{i}")
            response = conn.getresponse()
            assert response.status == 200 and response.read().split()[2] == f"/k{i}".encode()
        conn.request("POST", "/echo", body=b"x" * 100_000)
        assert conn.getresponse().read().split()[0] == b"100000"
    finally:
        conn.close()
    assert "Traceback" not in server.log()


# --------------------------------------------------------------------------------------------
# bad clients: garbage, plain HTTP, a stalled handshake; none of them costs another client
# --------------------------------------------------------------------------------------------


def test_bad_clients_cost_nobody_and_slow_handshakes_time_out(start_server, certs, mode):
    server = _start(start_server, certs, mode, "--ssl-handshake-timeout", "1", "--log-level", "debug")
    port = server.port
    stalled = socket.create_connection(("127.0.0.1", port), timeout=20)  # never says hello
    partial = socket.create_connection(("127.0.0.1", port), timeout=20)
    partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a ClientHello, cut short
    garbage = socket.create_connection(("127.0.0.1", port), timeout=20)
    garbage.sendall(os.urandom(64) + b"\r\n\r\n")
    plain = socket.create_connection(("127.0.0.1", port), timeout=20)
    plain.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    gone = socket.create_connection(("127.0.0.1", port), timeout=20)
    gone.sendall(b"\x16\x03\x01\x02\x00\x01")
    gone.close()  # closed mid-handshake
    # meanwhile (one worker, one thread for wsgi-1) a good client is served, again and again
    for i in range(3):
        done = _curl("--cacert", str(certs.ca_pem), f"https://127.0.0.1:{port}/ok{i}")
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[2] == f"/ok{i}"
    # the garbage and plain HTTP are closed (no HTTP answer in clear text)
    for sock in (garbage, plain):
        data = read_to_end(sock)
        assert not data.startswith(b"HTTP/"), data
        sock.close()
    # the stalled handshakes hit --ssl-handshake-timeout (1 s), well before the client's 20 s
    started = time.monotonic()
    for sock in (stalled, partial):
        read_to_end(sock)
        sock.close()
    assert time.monotonic() - started < 15
    done = _curl("--cacert", str(certs.ca_pem), f"https://127.0.0.1:{port}/after")
    assert done.returncode == 0 and done.stdout.split()[2] == "/after"
    log = server.log()
    assert "Traceback" not in log, log
    assert len(server.workers()) == 1
    if mode.startswith("wsgi"):
        assert "TLS handshake with 127.0.0.1 failed: handshake timeout" in log


# --------------------------------------------------------------------------------------------
# mTLS
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "reqs"), [("wsgi-4", "2"), ("asgi-asyncio", "required")])
def test_mtls_required(start_server, certs, mode, reqs):
    server = _start(start_server, certs, mode, "--ca-certs", str(certs.ca_pem), "--cert-reqs", reqs)
    url = f"https://127.0.0.1:{server.port}/m"
    mine = ("--cert", str(certs.client_cert), "--key", str(certs.client_key))
    ok = _curl("--cacert", str(certs.ca_pem), *mine, url)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split()[2] == "/m"
    refused = _curl("--cacert", str(certs.ca_pem), url)
    assert refused.returncode != 0 and not refused.stdout
    # a certificate from another CA is refused too
    other = trustme.CA().issue_cert("intruder@example.com")
    ctx = certs.client_context()
    tmp = Path(server.log_path).parent
    other.private_key_and_cert_chain_pem.write_to_path(str(tmp / "intruder.pem"))
    ctx.load_cert_chain(str(tmp / "intruder.pem"))
    with (
        pytest.raises((ssl.SSLError, ConnectionError)),
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # TLS 1.3: the refusal comes here
        if not sock.recv(100):
            raise ConnectionError("closed")
    ok = _curl("--cacert", str(certs.ca_pem), *mine, url)
    assert ok.returncode == 0, ok.stderr
    assert "Traceback" not in server.log()


@pytest.mark.parametrize("mode", ["asgi-asyncio", "asgi-uvloop"])
def test_asgi_tls_extension_shows_the_client_certificate(start_server, certs, mode):
    """scope["extensions"]["tls"] (the ASGI TLS extension): the verified client certificate as PEM
    and its subject in RFC 4514, the TLS version and cipher suite as their wire numbers."""
    server = _start(start_server, certs, mode, "--ca-certs", str(certs.ca_pem), "--cert-reqs", "optional")
    url = f"https://127.0.0.1:{server.port}/tls"
    mine = ("--cert", str(certs.client_cert), "--key", str(certs.client_key))
    seen = json.loads(_curl("--cacert", str(certs.ca_pem), *mine, url).stdout)
    client_pem = certs.client_cert.read_text()
    (chain_pem,) = seen["client_cert_chain"]
    assert ssl.PEM_cert_to_DER_cert(chain_pem) == ssl.PEM_cert_to_DER_cert(client_pem)
    subject = x509.load_pem_x509_certificate(client_pem.encode()).subject.rfc4514_string()
    assert seen["client_cert_name"] == subject and subject.startswith("OU=Testing cert")
    assert seen["tls_version"] in (0x0303, 0x0304) and seen["client_cert_error"] is None
    with _tls_socket(certs, server.port) as sock:  # Python's client: its suite by name -> number
        sock.sendall(b"GET /tls HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        body = json.loads(read_to_end(sock).partition(b"\r\n\r\n")[2])
        name, version = sock.cipher()[0], sock.version()
    ids = {c["name"]: c["id"] & 0xFFFF for c in ssl.create_default_context().get_ciphers()}
    assert body["cipher_suite"] == ids[name]
    assert body["client_cert_chain"] == [] and body["client_cert_name"] is None  # no certificate sent
    assert body["tls_version"] == {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}[version]


# --------------------------------------------------------------------------------------------
# the monitor: bad files at start, new files on HUP
# --------------------------------------------------------------------------------------------


def test_bad_certificate_files_exit_2_with_one_line(tmp_path, certs):
    other = Certs(tmp_path, "-other")
    pair = certs.args()
    cases = [
        (["--certfile", str(tmp_path / "missing.pem")], "No such file"),
        (["--certfile", str(certs.cert), "--keyfile", str(other.key)], "does not match"),
        ([*pair, "--keyfile", str(tmp_path / "nokey.pem")], "--keyfile"),
        ([*pair, "--cert-reqs", "required"], "--ca-certs"),
        ([*pair, "--cert-reqs", "3"], "--cert-reqs"),
        (["--keyfile", str(certs.key)], "--certfile"),
        ([*pair, "--ciphers", "NOPE"], "--ciphers"),
    ]
    for args, expected in cases:
        done = run_cli("--control-socket", "off", "-b", "127.0.0.1:0", *args, "tests.apps.tls_apps:wsgi")
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, done.stderr)
        assert "Traceback" not in done.stderr


def test_check_config_loads_the_certificate(tmp_path, certs):
    other = Certs(tmp_path, "-other")
    app = "tests.apps.tls_apps:wsgi"
    good = run_cli("--check-config", *certs.args(), app)
    assert good.returncode == 0 and "config ok" in good.stdout, good.stderr
    bad = run_cli("--check-config", "--certfile", str(certs.cert), "--keyfile", str(other.key), app)
    assert bad.returncode == 2 and "does not match" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("mode", ["wsgi-1", "asgi-uvloop"])
def test_hup_serves_new_certificate(start_server, tmp_path, certs, mode):
    first = Certs(tmp_path, "-first")
    cert, key = tmp_path / "live-cert.pem", tmp_path / "live-key.pem"
    cert.write_bytes(first.cert.read_bytes())
    key.write_bytes(first.key.read_bytes())
    server = start_server("--certfile", str(cert), "--keyfile", str(key), *MODES[mode], app=APPS[mode],
                          workers=2)  # fmt: skip

    def served_cert() -> bytes:
        pem = ssl.get_server_certificate(("127.0.0.1", server.port), timeout=10)
        return ssl.PEM_cert_to_DER_cert(pem)

    assert served_cert() == ssl.PEM_cert_to_DER_cert(first.server_cert_pem.decode())
    second = Certs(tmp_path, "-second")
    # a broken swap first: HUP keeps the running generation and says why
    key.write_bytes(other_key := Certs(tmp_path, "-third").key.read_bytes())
    assert other_key
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: "does not match" in server.log(), what="the reload refused")
    assert served_cert() == ssl.PEM_cert_to_DER_cert(first.server_cert_pem.decode())
    # a worker added to the running generation now serves the generation's certificate: the files
    # were read once, when the monitor checked them (not the broken ones on disk now)
    assert server.request("ttin")["ok"] is True
    server.wait_for(lambda: len(server.workers()) == 3, what="a third worker")
    for _ in range(6):
        assert served_cert() == ssl.PEM_cert_to_DER_cert(first.server_cert_pem.decode())
    # the real swap
    cert.write_bytes(second.cert.read_bytes())
    key.write_bytes(second.key.read_bytes())
    server.signal(signal.SIGHUP)
    new = ssl.PEM_cert_to_DER_cert(second.server_cert_pem.decode())
    server.wait_for(lambda: served_cert() == new and all(w["generation"] >= 1 for w in server.workers())
                    and len(server.workers()) == 3, what="the new certificate")  # fmt: skip
    for _ in range(6):  # every worker now: new connections see the new certificate
        assert served_cert() == new
        done = _curl("--cacert", str(second.ca_pem), f"https://127.0.0.1:{server.port}/new")
        assert done.returncode == 0, done.stderr
    assert _curl("--cacert", str(first.ca_pem), f"https://127.0.0.1:{server.port}/").returncode != 0
    assert "Traceback" not in server.log(), server.log()


def test_unix_listener_stays_plain(start_server, tmp_path, certs):
    path = tmp_path / "plain.sock"
    server = start_server(*certs.args(), "-b", f"unix:{path}", app=APPS["wsgi-1"], workers=1)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(b"GET /u HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = read_to_end(sock)
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"/u") and b"http " in data
    done = _curl("--cacert", str(certs.ca_pem), f"https://127.0.0.1:{server.port}/t")
    assert done.returncode == 0 and done.stdout.startswith("https ")


@pytest.mark.parametrize("mode", ["wsgi-1", "asgi-asyncio", "asgi-uvloop"])
def test_refork_during_a_handshake_does_not_keep_the_connection_open(start_server, certs, mode):
    """A worker promoted to a mold while a client is still in its handshake (asyncio knows no protocol
    for it yet): the new mold keeps no copy of that socket (process/fork_check.py cuts connections
    accepted on the listeners), so the client sees the close."""
    server = _start(start_server, certs, mode, "--ssl-handshake-timeout", "3")
    old = {w["pid"] for w in server.workers()}
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=25)
    stalled.sendall(b"\x16\x03\x01\x02\x00\x01")  # a ClientHello that never ends
    server.wait_for(lambda: accept_queue(server.port) == 0, what="the worker to accept it")
    assert server.request("refork")["ok"] is True
    server.wait_for(lambda: (m := server.mold()) and m["generation"] >= 1, what="the new mold")
    server.wait_for(lambda: not old & {w["pid"] for w in server.workers(None)}, what="old worker gone")
    assert read_to_end(stalled) == b""  # closed (by the handshake timeout or the old worker's exit)
    stalled.close()
    done = _curl("--cacert", str(certs.ca_pem), f"https://127.0.0.1:{server.port}/")
    assert done.returncode == 0, done.stderr


def test_term_serves_tls_connections_queued_in_the_backlog(start_server, certs):
    """ASGI over TLS, the loop held by a slow request: the connections waiting in the listen
    backlog are taken at the stop and served over TLS (not read as plain HTTP)."""
    server = start_server(*certs.args(), "--shutdown-delay", "0.5", "--graceful-timeout", "20",
                          app="apps.lifecycle_apps:asgi", workers=1)  # fmt: skip
    first = _tls_socket(certs, server.port)
    first.sendall(b"GET /block?3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    server.wait_for(lambda: server.workers()[0]["busy"] == 1, what="the worker's loop in the app")
    replies: dict[int, bytes] = {}

    def client(i: int) -> None:
        try:
            sock = _tls_socket(certs, server.port)  # the handshake waits for the loop
            sock.sendall(f"GET /q{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            replies[i] = read_to_end(sock)
            sock.close()
        except OSError as e:
            replies[i] = repr(e).encode()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    server.wait_for(lambda: accept_queue(server.port) == 4, what="the clients queued in the backlog")
    server.signal(signal.SIGTERM)
    assert read_to_end(first).startswith(b"HTTP/1.1 200 OK")
    first.close()  # (else the server waits for its close_notify, up to --ssl-handshake-timeout)
    for t in threads:
        t.join()
    for i in range(4):
        assert replies[i].startswith(b"HTTP/1.1 200 OK"), (i, replies[i], server.log())
    assert server.wait_exit() == 0



def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmRSS:"))


def test_idle_tls_connections_cost_the_worker_little(start_server, certs, mode):
    """200 TLS connections that do nothing after their handshake cost a worker under 40 MiB: the
    ASGI loop's SSL layer gives each a read buffer of the worker's read size, not asyncio's
    256 KiB zeroed for every one (measured on asyncio: 60 MiB for 200 before, 22 MiB after)."""
    server = _start(start_server, certs, mode)
    pid = server.workers()[0]["pid"]
    baseline = _rss(pid)
    socks = [_tls_socket(certs, server.port) for _ in range(200)]
    try:
        socks[-1].sendall(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")  # answered: all before are in
        assert _read_response(socks[-1], bytearray()).startswith(b"HTTP/1.1 200")
        grown = _rss(pid) - baseline
    finally:
        for s in socks:
            s.close()
    assert grown < 40 << 20, f"200 idle TLS connections cost the worker {grown >> 20} MiB"


# asyncio takes a bound on its TLS close (ssl_shutdown_timeout) from Python 3.11; uvloop on every Python
BOUNDED_CLOSE = [m for m in MODES if m != "asgi-asyncio" or sys.version_info >= (3, 11)]


@pytest.mark.parametrize("mode", BOUNDED_CLOSE)
def test_a_client_that_never_sends_its_close_notify_does_not_hold_the_stop(start_server, certs, mode):
    """The server's TLS close waits for the client's close_notify only as long as a cleartext
    close lingers (a second): a client that reads its answer and never closes holds no drain."""
    server = _start(start_server, certs, mode)
    sock = _tls_socket(certs, server.port)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert read_to_end(sock).startswith(b"HTTP/1.1 200 OK")  # (its close_notify is never sent)
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=15) == 0, server.log()
    sock.close()


@pytest.mark.parametrize("mode", ["wsgi-1", "wsgi-4"])  # (ASGI's /slow awaits: no --timeout for it)
def test_a_request_past_timeout_gets_its_500_over_tls(start_server, certs, mode):
    """--timeout on a TLS connection: the request blocked in the app is answered 500 (under
    --threads by the loop's thread, once the worker drained), the worker replaced."""
    server = _start(start_server, certs, mode, "--timeout", "1", "--graceful-timeout", "1")
    with _tls_socket(certs, server.port) as sock:
        sock.sendall(b"GET /slow?30 HTTP/1.1\r\nHost: x\r\n\r\n")
        response = _read_response(sock, bytearray())
    assert response.startswith(b"HTTP/1.1 500 "), response
    wait_until(lambda: "busy longer than 1s" in server.log() and len(server.workers()) == 1,
               what="the replacement")  # fmt: skip
