"""Real PostgreSQL and Redis for the fork-safety proof, on loopback in a temporary directory.

Installed from the Debian packages when missing (we are root in CI and in ./scripts/test); a
missing server fails the run instead of skipping it: a skipped proof proves nothing. Started once
per session and stopped at its end, leaving no process and no directory behind.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import free_port

_apt_updated = False


def ensure_installed(found: bool, package: str) -> None:
    """apt-get install `package` unless `found`; fail (not skip) when that is impossible."""
    global _apt_updated
    if found:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail(f"these tests need the Debian package {package!r}: "
                    f"`sudo apt-get install {package}` (or run ./scripts/test as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
        _apt_updated = True
    subprocess.run(["apt-get", "install", "-y", "-qq", package], check=True, env=env, capture_output=True)


def wait_until(predicate, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class Postgres:
    """A throw-away cluster: trust auth on 127.0.0.1, one role and one database for the apps."""

    user = "refork"
    password = "refork"
    database = "refork_proof"

    def __init__(self, bin_dir: str, root: str) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.data = os.path.join(root, "data")
        self.port = free_port()
        # PostgreSQL refuses to run as root: as root, run it as the `postgres` system user.
        self.run_as = "postgres" if os.geteuid() == 0 else None
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            os.chown(root, entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [os.path.join(self.bin_dir, args[0]), *args[1:]],
            user=self.run_as, cwd=self.root, capture_output=True, text=True, timeout=60,
        )
        if result.returncode != 0:
            output = result.stdout + result.stderr
            raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}):\n{output}")
        return result

    def start(self) -> None:
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200 "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.root, "server.log"), "-w", "-t", "60",
                  "-o", options, "start")
        self.sql(f"CREATE ROLE {self.user} LOGIN PASSWORD '{self.password}'", database="postgres",
                 user="postgres")
        self.sql(f"CREATE DATABASE {self.database} OWNER {self.user}", database="postgres", user="postgres")

    def stop(self) -> None:
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def sql(self, query: str, database: str | None = None, user: str = "postgres") -> list[list[str]]:
        """Run one statement with psql; rows as lists of strings (psql unaligned, `|`-separated)."""
        result = subprocess.run(
            [os.path.join(self.bin_dir, "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-h", "127.0.0.1", "-p", str(self.port), "-U", user, "-d", database or self.database,
             "-c", query],
            capture_output=True, text=True, timeout=30,
            env={**os.environ, "PGAPPNAME": "refork-proof-observer"},
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql {query!r} failed:\n{result.stderr}")
        return [line.split("|") for line in result.stdout.splitlines() if line]

    def backends(self, application_name: str) -> dict[int, int]:
        """{client port: backend pid} of the client backends with that application_name."""
        rows = self.sql(
            "SELECT client_port, pid FROM pg_stat_activity WHERE backend_type = 'client backend' "
            f"AND datname = '{self.database}' AND application_name = '{application_name}'"
        )
        return {int(port): int(pid) for port, pid in rows}

    def env(self) -> dict[str, str]:
        return {
            "REFORK_PROOF_PG_HOST": "127.0.0.1",
            "REFORK_PROOF_PG_PORT": str(self.port),
            "REFORK_PROOF_PG_USER": self.user,
            "REFORK_PROOF_PG_PASSWORD": self.password,
            "REFORK_PROOF_PG_DATABASE": self.database,
        }


def postgres_bin_dir() -> str | None:
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return next((d for d in reversed(dirs) if os.path.exists(os.path.join(d, "initdb"))), None)


class Redis:
    """redis-server in the foreground on a free loopback port, without persistence."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log = open(os.path.join(self.root, "redis.log"), "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--dir", self.root, "--protected-mode", "no"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_until(lambda: self.proc.poll() is not None or accepts(self.port), "redis-server to listen")
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited:\n{Path(self.log.name).read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def command(self, *args: str) -> bytes:
        """One command over a fresh connection (RESP by hand); the reply's payload."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=10) as s:
            s.sendall(b"".join([f"*{len(args)}\r\n".encode()]
                               + [f"${len(a.encode())}\r\n{a}\r\n".encode() for a in args]))
            reply = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
                if reply[:1] in b"+-:" and reply.endswith(b"\r\n"):
                    break
                if reply[:1] == b"$":
                    size, _, rest = reply[1:].partition(b"\r\n")
                    if int(size) < 0 or len(rest) >= int(size) + 2:
                        break
        if reply[:1] == b"-":
            raise RuntimeError(reply.decode())
        if reply[:1] == b"$":
            size, _, rest = reply[1:].partition(b"\r\n")
            return rest[: int(size)]
        return reply[1:-2]

    def clients(self, name: str) -> dict[int, int]:
        """{client port: client id} of the connections that named themselves `name`."""
        clients = {}
        for line in self.command("CLIENT", "LIST").decode().splitlines():
            fields = dict(f.split("=", 1) for f in line.split(" ") if "=" in f)
            if fields.get("name") == name:
                clients[int(fields["addr"].rsplit(":", 1)[1])] = int(fields["id"])
        return clients

    def env(self) -> dict[str, str]:
        return {"REFORK_PROOF_REDIS_URL": f"redis://127.0.0.1:{self.port}/0"}


@contextmanager
def postgres() -> Iterator[Postgres]:
    ensure_installed(postgres_bin_dir() is not None, "postgresql")
    bin_dir = postgres_bin_dir()
    assert bin_dir is not None
    root = tempfile.mkdtemp(prefix="refork-pg-")  # not under pytest's 0700 tmp: `postgres` must enter
    server = Postgres(bin_dir, root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def redis() -> Iterator[Redis]:
    ensure_installed(shutil.which("redis-server") is not None, "redis-server")
    root = tempfile.mkdtemp(prefix="refork-redis-")
    server = Redis(root)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
