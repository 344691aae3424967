"""Start real refork servers (the CLI, as a user would) and talk HTTP to them."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))


_PORT_BAND = 1500  # ports per pytest process, from 20000 up: below the kernel's ephemeral range
_ports = random.Random()  # its own generator: tests that seed the global one do not repeat ports
_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now for a server to bind, below the kernel's ephemeral range (32768 and up on
    Linux: the local port of every client socket comes from there, so a port taken from it could
    be some test's client by the time the server binds it), in this pytest-xdist process's own
    band (parallel processes never pick the same port), and never one it handed out before (two
    ports taken for one server, say its own and --metrics-bind, differ)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    low = 20000 + (int(worker) % 8 if worker.isdigit() else 0) * _PORT_BAND
    for _ in range(200):
        port = _ports.randrange(low, low + _PORT_BAND)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        if len(_handed_out) > _PORT_BAND // 2:  # a long run: start over (those servers are long gone)
            _handed_out.clear()
            _handed_out.add(port)
        return port
    with socket.socket() as s:  # the band is full: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read_to_end(sock: socket.socket) -> bytes:
    """Everything until the server closes (or resets) the connection; fails on a socket timeout."""
    chunks = []
    while True:
        try:
            data = sock.recv(1 << 20)
        except ConnectionResetError:
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


PINNED = {"--refork-after": "off", "--mold-idle-exit": "off"}


def pinned_generation(args: tuple[str, ...]) -> list[str]:
    """Flags that keep one generation and its mold for a test about something else.

    The defaults refork after a few dozen requests and stop an idle mold; a test that counts a
    worker's requests or signals the mold would race them. Tests of the defaults themselves (the
    promise matrix) pass ``defaults=True``; a test naming either flag keeps its own (and sets
    neither in a config file: the flags given here would win).
    """
    named = {a.split("=")[0] for a in args}
    return [item for flag, value in PINNED.items() if flag not in named for item in (flag, value)]


class LoggedProcess:
    """A server process whose output goes to a log file: read it, stop it (INT, then KILL)."""

    proc: subprocess.Popen
    log_file: Any
    log_path: Path

    def log(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()


class Server(LoggedProcess):
    """One `python -m refork ...` process tree."""

    def __init__(
        self,
        tmp: Path,
        args: list[str],
        app: str,
        env: dict[str, str] | None,
        preexec_fn: Any = None,
        defaults: bool = False,
    ) -> None:
        if not defaults:
            args = [*pinned_generation(tuple(args)), *args]
        self.port = free_port()
        self.control = str(tmp / f"refork-{self.port}.ctl")
        self.log_path = tmp / f"refork-{self.port}.log"
        cmd = [
            sys.executable,
            "-m",
            "refork",
            "-b",
            f"127.0.0.1:{self.port}",
            "--control-socket",
            self.control,
            "--chdir",
            str(TESTS),
            *args,
            app,
        ]
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=preexec_fn,
        )

    # --- control socket ---
    def request(self, command: str) -> dict:
        from refork.process.control import request

        return request(self.control, command)

    def status(self) -> dict:
        return self.request("status")

    def workers(self, state: str | None = "ready") -> list[dict]:
        return [
            p
            for p in self.status()["processes"]
            if p["role"] == "worker" and (state is None or p["state"] == state)
        ]

    def one_generation(self, workers: int) -> int | None:
        """The server's generation once `workers` serve and every worker process is of it (else None)."""
        status = self.status()
        procs = [p for p in status["processes"] if p["role"] == "worker"]
        serving = [p for p in procs if p["state"] == "ready"]
        same = {p["generation"] for p in procs} == {status["generation"]}
        return status["generation"] if same and len(serving) == workers else None

    def mold(self) -> dict | None:
        molds = [p for p in self.status()["processes"] if p["role"] == "mold" and p["state"] == "ready"]
        return max(molds, key=lambda p: p["generation"]) if molds else None

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        last_error = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"server exited ({self.proc.returncode}) waiting for {what}:\n{self.log()}"
                )
            try:
                value = predicate()
                if value:
                    return value
            except (OSError, ValueError, KeyError) as e:
                last_error = e
            time.sleep(0.05)
        raise AssertionError(
            f"timed out waiting for {what} (last error: {last_error}); {self.processes()}:\n{self.log()}"
        )

    def processes(self) -> str:
        """The processes as `refork status` last saw them, for a failure's message."""
        try:
            rows = self.status()["processes"]
        except (OSError, ValueError, KeyError) as e:
            return f"no status ({e})"
        return "processes: " + ", ".join(
            f"{p['role']} {p['pid']} gen {p['generation']} {p['state']}"
            + (f" ({p['retiring']})" if p["retiring"] else "")
            for p in rows
        )

    def wait_ready(self, workers: int, timeout: float = 30.0) -> list[dict]:
        return self.wait_for(
            lambda: len(w := self.workers()) >= workers and w, timeout, f"{workers} ready workers"
        )

    # --- HTTP ---
    def get(self, path: str = "/", timeout: float = 10.0, headers: dict | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def serving_pid(self) -> int:
        return int(self.get("/")[1].split()[0])

    # --- process ---
    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)



@pytest.fixture
def start_server(tmp_path):
    servers: list[Server] = []

    def start(
        *args: str,
        app: str = "apps.procs:app",
        workers: int | None = 2,
        wait: bool = True,
        env: dict[str, str] | None = None,
        preexec_fn: Any = None,
        defaults: bool = False,
    ) -> Server:
        extra = list(args)
        if workers is not None:
            extra = ["-w", str(workers), *extra]
        server = Server(tmp_path, extra, app, env, preexec_fn, defaults)
        servers.append(server)
        if wait:
            server.wait_ready(workers or 1)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def serve():
    """Start ASGI servers in subprocesses (tests/support/asgi_server.py); kill those left at the end."""
    from support.asgi_server import Proc  # here, not at the top: that module imports this one

    procs: list[Proc] = []

    def start(spec: str = "apps.asgi_apps:app", **kw) -> Proc:
        proc = Proc(spec, **kw)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def pids_alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[-1].split()[0] != "Z":
                    alive.append(pid)
        except (ProcessLookupError, FileNotFoundError):
            pass
    return alive


def run_cli(
    *args: str, timeout: float = 30.0, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m refork ARGS` (with `env` added to the environment); a server it starts gets a
    control socket of its own (another refork on this machine may hold the default one and make it
    print a warning)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "REFORK_CONTROL_SOCKET": os.path.join(tmp, "ctl"), **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "refork", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=cwd or ROOT,
            env=env,
        )


__all__ = ["Server", "free_port", "pids_alive", "run_cli", "json"]
