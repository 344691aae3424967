"""HTTP/2 with the clients people run, beside curl and httpx (tests/serving/test_http2.py):
nghttp (nghttp2's client) over h2c and TLS, many streams and uploads on one connection, and
headless Chromium over TLS, a page that fetches 50 resources at once on one connection. Every
interface and loop of test_http2.py; the app is tests/apps/h2_page.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from support.certs import Certs
from support.chromium import run_page
from test_http2 import SERVERS

PAGE = {"asgi": "apps.h2_page:app", "wsgi": "apps.h2_page:wsgi_app"}
RESOURCES = 50


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("h2certs"))


@pytest.fixture(params=list(SERVERS))
def page_server(request: pytest.FixtureRequest, start_server, tmp_path: Path):
    """A server of every interface and loop serving the page app; returns (start, report dir)."""
    _, flags = SERVERS[request.param]
    app = PAGE[request.param.split("-")[0]]

    def start(*args: str):
        return start_server(*flags, *args, app=app, workers=1, env={"REPORT_DIR": str(tmp_path)})

    return start, tmp_path


def _answers(stdout: str) -> list[dict]:
    """The JSON answers nghttp wrote one after another (it writes every body to stdout)."""
    return [json.loads(m) for m in re.findall(r"\{[^{}]*\}", stdout)]


def _nghttp(*args: str) -> subprocess.CompletedProcess[str]:
    nghttp = shutil.which("nghttp")
    assert nghttp, "nghttp is needed (Debian's nghttp2-client; ./scripts/test installs it)"
    return subprocess.run([nghttp, "--timeout=20", *args], capture_output=True, text=True, timeout=60)


def _one_connection(answers: list[dict], count: int) -> None:
    assert sorted(a["i"] for a in answers) == list(range(count))
    assert {a["protocol"] for a in answers} <= {"HTTP/2", "HTTP/2.0"}, answers
    assert len({a["port"] for a in answers}) == 1, "nghttp multiplexes its URIs on one connection"


@pytest.mark.parametrize("transport", ["h2c", "tls"])
def test_nghttp_many_streams_and_uploads_on_one_connection(page_server, certs, transport, tmp_path):
    start, _ = page_server
    server = start(*(["--http-protocols", "h2c,h1"] if transport == "h2c" else certs.args()))
    base = f"{'https' if transport == 'tls' else 'http'}://127.0.0.1:{server.port}"
    out = _nghttp(*[f"{base}/r/{i}" for i in range(20)])
    assert out.returncode == 0, out.stderr
    _one_connection(_answers(out.stdout), 20)
    upload = tmp_path / "upload"
    upload.write_bytes(os.urandom(300_000))  # past the 64 KiB initial window: flow control both ways
    out = _nghttp("-d", str(upload), *[f"{base}/r/{i}" for i in range(8)])
    assert out.returncode == 0, out.stderr
    answers = _answers(out.stdout)
    _one_connection(answers, 8)
    assert {a["body"] for a in answers} == {300_000}


def test_nghttp_upgrade_h2c_is_answered_over_http11(page_server):
    """The `Upgrade: h2c` of RFC 7540 3.2 is ignored (docs/http2.md): the answer is HTTP/1.1."""
    start, _ = page_server
    server = start("--http-protocols", "h2c,h1")
    out = _nghttp("-u", "-v", f"http://127.0.0.1:{server.port}/r/0")
    assert "upgrade: h2c" in out.stdout, out.stdout  # (nghttp did ask)
    assert "101 Switching" not in out.stdout
    _, response = out.stdout.split("HTTP Upgrade response", 1)
    assert response.lstrip().startswith("HTTP/1.1 200 OK")
    assert [a["protocol"] for a in _answers(response)] == ["HTTP/1.1"]


def test_chromium_fetches_50_resources_at_once_on_one_tls_connection(page_server, certs):
    start, reports = page_server
    server = start(*certs.args())
    token = f"t{os.getpid()}{time.monotonic_ns()}"
    report = reports / f"report-{token}.json"
    url = f"https://127.0.0.1:{server.port}/?n={RESOURCES}&token={token}"
    rc, log = run_page(url, report, "--ignore-certificate-errors")  # (the test CA is not the browser's)
    assert report.exists(), f"the page never reported (chromium rc {rc}):\n{log}"
    result = json.loads(report.read_text())
    assert "error" not in result, result
    assert result["page"] == "h2"
    assert result["protocols"] == ["h2"] * RESOURCES
    answers = result["answers"]
    assert sorted(a["i"] for a in answers) == list(range(RESOURCES))
    assert {a["protocol"] for a in answers} <= {"HTTP/2", "HTTP/2.0"}
    assert len({a["port"] for a in answers}) == 1, "Chromium fetched them on one connection"
    assert "Traceback" not in server.log_path.read_text()
