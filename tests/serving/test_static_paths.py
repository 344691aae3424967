"""--static on every request path, over real HTTP: the file, its validators and 304, a range, the
precompressed sibling, a refusal, and the app still answering beside the mount; the answers are
in the access log and counted apart in the metrics. A missing mount directory is exit 2, one line.
The header rules one by one are tests/serving/test_static.py's (no sockets)."""

from __future__ import annotations

import gzip
import http.client
import json
import re
from contextlib import closing

import pytest
from conftest import free_port, read_to_end, run_cli
from support.h2client import H2Client
from support.request_paths import connect, every_path, flags, http2, over_http11_only, tls

from refork.config import load_config

CSS = b"body { color: red }\n" * 400  # 8 KB: sent from memory
BIG = bytes(range(256)) * 400  # 100 KB: sent from the file (sendfile on plain HTTP/1.1)


def _requests(path: str, port: int, asks: list[tuple[str, str, dict[str, str]]]
              ) -> list[tuple[int, dict[str, str], bytes]]:  # fmt: skip
    """(status, header fields by lower-case name, body) of each (method, target, headers), in order
    on one connection as the path's clients send them."""
    out = []
    if http2(path):
        with closing(H2Client(port, timeout=10, tls=tls(path))) as client:
            for method, target, fields in asks:
                sid = client.send(method, target, fields=list(fields.items()))
                status, body = client.response(sid)
                heads = {k.decode(): v.decode() for k, v in client.heads.pop(sid).items()}
                out.append((status, heads, body))
        return out
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.sock = connect(path, port)
    try:
        for method, target, fields in asks:
            conn.request(method, target, headers=fields)
            resp = conn.getresponse()
            out.append((resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()))
    finally:
        conn.close()
    return out


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "collected"
    (root / "css").mkdir(parents=True)
    (root / "css" / "app.0123456789ab.css").write_bytes(CSS)
    (root / "css" / "app.0123456789ab.css.gz").write_bytes(gzip.compress(CSS))
    (root / "big.bin").write_bytes(BIG)
    (root / ".env").write_bytes(b"SECRET=1\n")
    return root


@every_path
def test_a_mount_answers_before_the_app_on_every_path(path, start_server, site, tmp_path):
    args, app = flags(path, "apps.access_apps")
    access, metrics = tmp_path / "access.log", free_port()
    server = start_server(*args, "--static", f"/static={site}", "--access-logfile", str(access),
                          "--access-log-format", "json", "--metrics-bind", f"127.0.0.1:{metrics}",
                          app=app, workers=1)  # fmt: skip
    css = "/static/css/app.0123456789ab.css"
    first, gzipped, ranged, head, app_page, dotfile, post, big, big_part = _requests(path, server.port, [
        ("GET", css, {}), ("GET", css, {"accept-encoding": "gzip"}), ("GET", css, {"range": "bytes=10-19"}),
        ("HEAD", css, {}), ("GET", "/hello", {}), ("GET", "/static/.env", {}), ("POST", css, {}),
        ("GET", "/static/big.bin", {}), ("GET", "/static/big.bin", {"range": "bytes=1000-70999"}),
    ])  # fmt: skip
    assert big[0] == 200 and big[2] == BIG and big[1]["content-type"] == "application/octet-stream"
    assert big_part[0] == 206 and big_part[2] == BIG[1000:71000]
    status, h, body = first
    assert (status, body) == (200, CSS)
    assert h["content-type"] == "text/css; charset=utf-8" and h["content-length"] == str(len(CSS))
    assert h["cache-control"] == "public, max-age=31536000, immutable" and h["vary"] == "Accept-Encoding"
    assert h["etag"] and h["last-modified"]
    (not_modified,) = _requests(path, server.port, [("GET", css, {"if-none-match": h["etag"]})])
    assert not_modified[0] == 304 and not_modified[2] == b""
    assert (
        gzipped[0] == 200 and gzipped[1]["content-encoding"] == "gzip" and gzip.decompress(gzipped[2]) == CSS
    )
    assert (
        ranged[0] == 206
        and ranged[2] == CSS[10:20]
        and ranged[1]["content-range"] == f"bytes 10-19/{len(CSS)}"
    )
    assert head[0] == 200 and head[2] == b"" and head[1]["content-length"] == str(len(CSS))
    assert app_page[0] == 200 and app_page[2] == b"hello\n"
    assert dotfile[0] == 403 and b".env" not in dotfile[2] and b"SECRET" not in dotfile[2]
    assert post[0] == 405 and post[1]["allow"] == "GET, HEAD"

    lines = server.wait_for(lambda: len(n := _lines(access)) == 10 and n, what="the access lines")
    statics = [(css, s, True) for s in (200, 200, 200, 206, 304, 405)]
    logged = sorted((line["path"], line["status"], line["static"]) for line in lines)
    bigs = [("/static/big.bin", 200, True), ("/static/big.bin", 206, True)]
    assert logged == [("/hello", 200, False), ("/static/.env", 403, True), *bigs, *statics]
    counted = server.wait_for(lambda: (n := _counts(metrics))[0]["2xx"] == 6 and n, what="the counts")
    static, app_counts = counted
    assert static == {"2xx": 6, "3xx": 1, "4xx": 2, "5xx": 0}
    # the app's counts hold /hello alone (its request, status and time); by protocol, all ten
    assert app_counts == {"requests": 1, "2xx": 1, "timed": 1, "by protocol": 10}


# raw request targets as a client may send them, past any client library's normalization
NASTY = [
    b"/static/../secret.txt", b"/static/%2e%2e/secret.txt", b"/static/%2E%2E/%2E%2E/secret.txt",
    b"/static/..%2fsecret.txt", b"/static/..%5csecret.txt", b"/static/..\\secret.txt", b"/static/out.txt",
    b"/static/outdir/secret.txt", b"/static/%252e%252e/secret.txt", b"/static/.%2e/secret.txt",
    b"/static/%c0%ae%c0%ae/secret.txt", b"/static//../secret.txt", b"/static/./../secret.txt",
    b"/static/css/../../secret.txt", b"/static/..;/secret.txt", b"/static/%00/../secret.txt",
    b"http://x/static/../secret.txt", b"/static/.env", b"/static/%2eenv", b"/static/..",
]  # fmt: skip


@over_http11_only("an HTTP/2 client library refuses most of these :path values before they are sent")
def test_no_raw_target_gets_a_byte_from_outside_the_mount(path, start_server, site, tmp_path):
    (tmp_path / "secret.txt").write_bytes(b"OUTSIDE-THE-MOUNT\n")
    (site / "out.txt").symlink_to(tmp_path / "secret.txt")
    (site / "outdir").symlink_to(tmp_path)
    args, app = flags(path, "apps.access_apps")
    server = start_server(*args, "--static", f"/static={site}", app=app, workers=1)
    for target in NASTY:
        with connect(path, server.port) as sock:
            sock.sendall(b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = read_to_end(sock)
        assert b"OUTSIDE-THE-MOUNT" not in answer and b"SECRET" not in answer, target
        assert answer.split(b" ", 2)[1] in (b"400", b"403", b"404"), (target, answer[:200])


def _lines(access) -> list[dict]:
    return [json.loads(line) for line in access.read_text().splitlines()] if access.exists() else []


def _counts(port: int) -> tuple[dict[str, int], dict[str, int]]:
    """The static answers by class; the app's requests, 2xx responses and timed requests, and the
    requests by protocol (all of them)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    static = {c: int(n) for c, n in re.findall(r'refork_static_requests_total\{code="(\w+)"\} (\d+)', text)}
    value = {name: int(float(n)) for name, n in re.findall(r"^(refork_\S+) (\S+)$", text, re.M)}
    return static, {
        "requests": value["refork_requests_total"],
        "2xx": value['refork_responses_total{code="2xx"}'],
        "timed": value["refork_request_duration_seconds_count"],
        "by protocol": sum(v for k, v in value.items() if k.startswith("refork_protocol_requests_total")),
    }


def test_a_missing_mount_directory_is_one_line_and_exit_2(tmp_path):
    missing = f"/static={tmp_path / 'nope'}"
    result = run_cli("--static", missing, "--pythonpath", "tests", "-b", ":0", "apps.access_apps:wsgi")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "is not a directory" in result.stderr, result.stderr


@pytest.mark.parametrize("spec", ["static=dir", "/=dir", "/static", "/static="])
def test_a_malformed_mount_is_exit_2(tmp_path, spec):
    result = run_cli("--static", spec, "apps.access_apps:wsgi")
    assert result.returncode == 2 and "PREFIX=DIRECTORY" in result.stderr, result.stderr


def test_mounts_from_pyproject_and_a_config_file(tmp_path, site):
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.refork]\nstatic = ["/assets={site}"]\nstatic_max_age = 5\n'
    )
    config = load_config(["apps.access_apps:wsgi"], {}, str(tmp_path))
    assert (config.static, config.static_max_age) == ([f"/assets={site}"], 5)
    (tmp_path / "refork.conf.py").write_text(f"static = ['/a={site}', '/b/={site}']\n")
    config = load_config(["-c", str(tmp_path / "refork.conf.py"), "apps.access_apps:wsgi"], {}, str(tmp_path))
    assert config.static == [f"/a={site}", f"/b={site}"]
