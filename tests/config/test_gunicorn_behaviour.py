"""The gunicorn-behaviour suite: one config file run under gunicorn 27 (a test dependency) and under
refork, and what a client or an operator meets compared: what the app sees of a request with
spoofed X-Forwarded-* headers, the access log's lines, a value refused at start."""

from __future__ import annotations

import http.client
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, LoggedProcess, free_port
from support.waits import wait_until

WSGI, ASGI = "apps.access_apps:wsgi", "apps.access_apps:asgi"
ACCESS = re.compile(r'\S* - "[A-Z]+ ')
SPOOFED = {"X-Forwarded-For": "198.51.100.1, 203.0.113.9", "X-Forwarded-Proto": "https"}


class Gunicorn(LoggedProcess):
    """`python -m gunicorn -c CONFIG APP` on a port of its own, output to a log file."""

    def __init__(self, tmp: Path, config: Path, app: str) -> None:
        self.port = free_port()
        self.log_path = tmp / f"gunicorn-{self.port}.log"
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", str(config), "-b", f"127.0.0.1:{self.port}",
             "--chdir", str(TESTS), app],
            cwd=ROOT, stdout=self.log_file, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        wait_until(self._serving, what=f"gunicorn on {self.port}")

    def _serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"gunicorn exited ({self.proc.returncode}):\n{self.log()}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False


@pytest.fixture
def both(start_server, tmp_path):
    """start(config text, app, *refork flags) -> (gunicorn, refork), each serving `app` with that file."""
    started: list[Gunicorn] = []

    def start(text: str, app: str, *flags: str):
        config = tmp_path / f"gunicorn-{len(started)}.conf.py"
        config.write_text(text)
        started.append(Gunicorn(tmp_path, config, app))
        return started[-1], start_server("-c", str(config), *flags, app=app, workers=1)

    yield start
    for server in started:
        server.stop()


def _seen(port: int, target: str = "/peer", headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", target, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _client_and_scheme(port: int) -> tuple[str, str]:
    """(REMOTE_ADDR / scope client, wsgi.url_scheme / scope scheme) behind spoofed headers."""
    status, body = _seen(port, headers=SPOOFED)
    assert status == 200, body
    address, _, scheme = body.split(" ")
    return address, scheme


@pytest.mark.parametrize(
    ("worker", "app"),
    [("sync", WSGI), ("gthread", WSGI), ("asgi", ASGI), ("uvicorn.workers.UvicornWorker", ASGI)],
)
def test_a_spoofed_forwarded_for_under_trust_everyone_is_seen_as_gunicorn_sees_it(both, worker, app):
    """forwarded_allow_ips = '*' (6 of 53 real configs): gunicorn's workers take the scheme only
    (REMOTE_ADDR the peer), uvicorn's the left-most X-Forwarded-For entry as well."""
    gunicorn, refork = both(f"forwarded_allow_ips = '*'\nworker_class = {worker!r}\n", app)
    assert _client_and_scheme(refork.port) == _client_and_scheme(gunicorn.port)
    expected = "198.51.100.1" if worker.startswith("uvicorn") else "127.0.0.1"
    assert _client_and_scheme(refork.port) == (expected, "https")


def _access_lines(log: str) -> list[str]:
    """The access lines of a log (uvicorn's: `ADDRESS - "REQUEST LINE" STATUS`), the client's port
    dropped (refork's line has none)."""
    return [re.sub(r"^(\S*?)(:\d+)? - ", r"\1 - ", line) for line in log.splitlines() if ACCESS.match(line)]


def test_uvicorn_worker_access_lines_are_uvicorns_as_under_gunicorn(both):
    gunicorn, refork = both("worker_class = 'uvicorn.workers.UvicornWorker'\naccesslog = '-'\n", ASGI)
    targets = ["/peer?x=1", "/missing?q=a%20b", "/stream"]  # (a quote: %22 from uvicorn 0.55 on, as refork)
    for server in (gunicorn, refork):
        for target in targets:
            _seen(server.port, target)
    wait_until(lambda: len(_access_lines(gunicorn.log())) == 3, what="gunicorn's access lines")
    wait_until(lambda: len(_access_lines(refork.log())) == 3, what="refork's access lines")
    assert _access_lines(refork.log()) == _access_lines(gunicorn.log()) == [
        '127.0.0.1 - "GET /peer?x=1 HTTP/1.1" 200',
        '127.0.0.1 - "GET /missing?q=a%20b HTTP/1.1" 404',
        '127.0.0.1 - "GET /stream HTTP/1.1" 200',
    ]


def _gunicorn_starts(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """gunicorn started on `config` (raw_env is read at start, after --check-config's checks)."""
    return subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", str(config), "-b", f"127.0.0.1:{free_port()}", "--chdir",
         str(TESTS), WSGI],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip


def _refork_checks(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "refork", "-c", str(config), "--print-config", "--chdir", str(TESTS), WSGI],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("line", "gunicorn_says", "refork_says"),
    [
        ("umask = '007'", "invalid literal for int() with base 0: '007'",
         'umask in {} must be a number Python reads, got "007" '
         "(gunicorn refuses it too: write 0o007 for octal)"),
        ("raw_env = ['']", "environment setting '' invalid", 'raw_env in {} must be KEY=VALUE, got ""'),
        ("raw_env = ['A=1', 'FOO']", "environment setting 'FOO' invalid",
         'raw_env in {} must be KEY=VALUE, got "FOO"'),
    ],
)  # fmt: skip
def test_a_value_gunicorn_refuses_is_refused_with_one_line(tmp_path, line, gunicorn_says, refork_says):
    config = tmp_path / "gunicorn.conf.py"
    config.write_text(line + "\n")
    gunicorn = _gunicorn_starts(config, tmp_path)
    assert gunicorn.returncode != 0 and gunicorn_says in gunicorn.stderr, gunicorn.stderr
    refork = _refork_checks(config, tmp_path)
    assert refork.returncode == 2
    assert refork.stderr.splitlines() == [f"refork: error: {refork_says.format(config)}"]


def test_umask_spellings_gunicorn_takes_are_taken(tmp_path):
    config = tmp_path / "gunicorn.conf.py"
    config.write_text("umask = '0o007'\nraw_env = ['A=1=2']\n")
    checked = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", str(config), "--check-config", "--chdir", str(TESTS), WSGI],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    refork = _refork_checks(config, tmp_path)
    assert refork.returncode == 0, refork.stderr
    assert "umask = 7 " in refork.stdout and "raw_env = ['A=1=2']" in refork.stdout


@pytest.mark.parametrize("threads", ["1", "2"])  # refork: the native engine, the pool engine
def test_a_request_past_timeout_gets_a_500_as_under_gunicorns_sync_worker(both, threads):
    """timeout = 1: gunicorn's arbiter aborts the worker (SIGABRT: SystemExit raised in the app), and
    its sync worker answers 500; refork answers it too, with --threads above 1 as well (gthread
    never times out a hung thread), once the worker's other requests had --graceful-timeout."""
    text = "worker_class = 'sync'\ntimeout = 1\ngraceful_timeout = 1\n"
    gunicorn, refork = both(text, "apps.promises:wsgi", "--threads", threads)
    assert _seen(gunicorn.port, "/sleep?30")[0] == 500
    assert _seen(refork.port, "/sleep?30")[0] == 500
    assert "WORKER TIMEOUT" in gunicorn.log() and "busy longer than 1s" in refork.log()
