"""The native engine's static cache (native/src/static_files) over real HTTP: a --static answer
Python decided once is answered again the same (head fields but Date, body, HEAD without one),
follows its file (changed: fresh; deleted: 404), leaves Range and conditional requests to Python,
and, on the engine and the pool engine, is answered without Python deciding again
(tests/apps/static_probe.py notes each decision) while still counted in
refork_static_requests_total; on the pool engine, by its I/O thread while an app thread holds the
GIL."""

from __future__ import annotations

import gzip
import http.client
import os
import re
import socket
import time
from contextlib import closing

import pytest
from conftest import free_port, read_to_end
from support.h2client import H2Client
from support.request_paths import connect, every_path, flags, http2, tls
from support.waits import sleeping_threads, wait_until

SMALL = b"a { b: c }\n" * 186  # 2 KB: held in memory
BIG = bytes(range(256)) * 240  # 60 KB: sent from the file
GZ = gzip.compress(SMALL, mtime=0)
Reply = tuple[int, list[tuple[str, str]], bytes]


def _ask(path: str, port: int, asks: list[tuple[str, str, dict[str, str]]]) -> list[Reply]:
    """(status, header fields in order without Date, body) of each (method, target, fields), in
    order on one connection."""
    out: list[Reply] = []
    if http2(path):
        with closing(H2Client(port, timeout=10, tls=tls(path))) as client:
            for method, target, fields in asks:
                sid = client.send(method, target, fields=list(fields.items()))
                status, body = client.response(sid)
                heads = [(k.decode(), v.decode()) for k, v in client.heads.pop(sid).items() if k != b"date"]
                out.append((status, heads, body))
        return out
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.sock = connect(path, port)
    try:
        for method, target, fields in asks:
            conn.request(method, target, headers=fields)
            resp = conn.getresponse()
            fields = [(k, v) for k, v in resp.getheaders() if k.lower() != "date"]
            out.append((resp.status, fields, resp.read()))
    finally:
        conn.close()
    return out


def _static_2xx(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return int(re.findall(r'refork_static_requests_total\{code="2xx"\} (\d+)', text)[0])


@every_path
def test_a_repeated_answer_is_the_first_one_and_follows_its_file(path, start_server, tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    (root / "app.css").write_bytes(SMALL)
    (root / "app.css.gz").write_bytes(GZ)
    (root / "big.bin").write_bytes(BIG)
    args, app = flags(path, "apps.access_apps")
    server = start_server(*args, "--static", f"/s={root}", app=app, workers=1)
    gz = {"accept-encoding": "gzip"}
    asks = [("GET", "/s/app.css", {}), ("HEAD", "/s/app.css", {}), ("GET", "/s/app.css", gz),
            ("GET", "/s/big.bin", {}), ("HEAD", "/s/big.bin", {}), ("GET", "/s/big.bin?v=1", {})]  # fmt: skip
    first, again = _ask(path, server.port, asks), _ask(path, server.port, asks + asks)
    assert again[: len(asks)] == first and again[len(asks) :] == first
    assert [r[2] for r in first] == [SMALL, b"", GZ, BIG, b"", BIG]
    etag = dict(first[0][1])["etag"]
    conditional = [("GET", "/s/app.css", {"range": "bytes=0-9"}),
                   ("GET", "/s/app.css", {"if-none-match": etag})]  # fmt: skip
    ranged, unchanged = _ask(path, server.port, conditional)
    assert (ranged[0], ranged[2], unchanged[0], unchanged[2]) == (206, SMALL[:10], 304, b"")

    (root / "app.css").write_bytes(b"changed\n")  # the sibling now older: not sent any more
    (root / "big.bin").write_bytes(BIG[:1000])
    os.utime(root / "big.bin", ns=(1, 1))
    small, coded, big = _ask(path, server.port, [asks[0], asks[2], asks[3]])
    assert small[0] == coded[0] == big[0] == 200
    assert small[2] == coded[2] == b"changed\n" and dict(small[1])["etag"] != etag
    assert big[2] == BIG[:1000] and dict(big[1])["content-length"] == "1000"
    (root / "app.css").unlink()
    (gone,) = _ask(path, server.port, [asks[0]])
    assert gone[0] == 404


@pytest.mark.parametrize("path", ["engine", "pool"])
def test_the_engine_answers_again_without_python_deciding(path, start_server, tmp_path):
    root = tmp_path / "site"
    root.mkdir()
    (root / "app.css").write_bytes(SMALL)
    (root / "big.bin").write_bytes(BIG)
    probe, metrics = tmp_path / "decided.txt", free_port()
    args, app = flags(path, "apps.static_probe")
    server = start_server(*args, "--static", f"/s={root}", "--metrics-bind", f"127.0.0.1:{metrics}",
                          app=app, workers=1, env={**os.environ, "STATIC_PROBE": str(probe)})  # fmt: skip
    asks = [("GET", "/s/app.css", {}), ("HEAD", "/s/app.css", {}), ("GET", "/s/big.bin", {})]
    replies = _ask(path, server.port, asks * 20)
    assert [r[2] for r in replies] == [SMALL, b"", BIG] * 20
    assert all(r == replies[i % 3] for i, r in enumerate(replies))
    assert probe.read_text().splitlines() == ["GET /s/app.css", "HEAD /s/app.css", "GET /s/big.bin"]
    assert server.wait_for(lambda: _static_2xx(metrics) == 60, what="60 static answers counted")
    _ask(path, server.port, [("GET", "/s/app.css", {"range": "bytes=0-9"})])
    assert probe.read_text().splitlines()[-1] == "GET /s/app.css"  # Python's again

    # the closing framings, Python's answer then the cache's (no Accept-Encoding: not http.client's
    # "identity", so app.css is decided once more)
    (root / "other.css").write_bytes(SMALL)
    decided = len(probe.read_text().splitlines())
    http10 = b"GET /s/other.css HTTP/1.0\r\n\r\n"
    for request in (http10, b"GET /s/app.css HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"):
        first, again = _raw(server.port, request), _raw(server.port, request)
        assert first == again and first.endswith(b"\r\n\r\n" + SMALL)
        assert b"\r\nConnection: close\r\n" in first
    assert probe.read_text().splitlines()[decided:] == ["GET /s/other.css", "GET /s/app.css"]


def _raw(port: int, request: bytes) -> bytes:
    """The whole answer to `request` on its own connection, without its Date field."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        return re.sub(rb"\r\nDate: [^\r]*", b"", read_to_end(sock))


def test_the_pool_answers_again_while_an_app_thread_holds_the_gil(start_server, tmp_path):
    """An app thread holds the GIL in a C call for 4 s (tests/apps/engine_apps.py /hold); the I/O
    thread meanwhile answers the cached files itself, a 4 MB one too (sendfile, as the client
    takes it), before that request is answered."""
    root = tmp_path / "site"
    root.mkdir()
    huge = os.urandom(1 << 16) * 64
    for name, data in (("app.css", SMALL), ("big.bin", BIG), ("huge.bin", huge)):
        (root / name).write_bytes(data)
    server = start_server("--wsgi-loop", "native", "--threads", "2", "--static", f"/s={root}",
                          app="apps.engine_apps:app", workers=1)  # fmt: skip
    asks = [("GET", "/s/app.css", {}), ("GET", "/s/big.bin", {}), ("GET", "/s/huge.bin", {})]
    first = _ask("pool", server.port, asks)  # decided by Python, cached
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as holding:
        holding.sendall(b"GET /hold?4 HTTP/1.1\r\nHost: t\r\n\r\n")
        [worker] = server.workers()
        wait_until(lambda: sleeping_threads(worker["pid"]), what="the request holding the GIL")
        began = time.monotonic()
        again = _ask("pool", server.port, asks)
        took = time.monotonic() - began
        holding.setblocking(False)
        with pytest.raises(BlockingIOError):
            holding.recv(1000)  # still holding the GIL
    assert again == first and [r[2] for r in again] == [SMALL, BIG, huge]
    assert took < 1.0, f"answered in {took:.2f} s"
