"""Fork safety proven from the servers' side: real PostgreSQL and Redis, real refork processes.

The sample apps (tests/apps/forksafe/) connect while they load, like real monoliths. With the
integrations off, `--fork-safety strict` must refuse them and name the line. With the defaults,
each worker must hold its own connections and the mold none: PostgreSQL's pg_stat_activity and
Redis's CLIENT LIST are mapped to the process that owns each client socket (the socket inode in
/proc/net/tcp, found among /proc/<pid>/fd), and every answer a worker gives names the server-side
connection that produced it, so a connection shared across a fork shows as one backend answering
two workers, or one socket owned by two processes.
"""

from __future__ import annotations

import http.client
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, Server, free_port
from support import services

FORKSAFE = TESTS / "apps" / "forksafe"
WORKERS = 4


# --- the servers ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres() -> Iterator[services.Postgres]:
    with services.postgres() as server:
        yield server


@pytest.fixture(scope="session")
def redis() -> Iterator[services.Redis]:
    with services.redis() as server:
        yield server


class Upstream(http.server.ThreadingHTTPServer):
    """A keep-alive HTTP/1.1 server the FastAPI app calls with httpx; answers the caller's port."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), UpstreamHandler)
        self.open: dict[int, bool] = {}  # client port -> connection currently open

    @property
    def port(self) -> int:
        return self.server_address[1]

    def clients(self) -> dict[int, int]:
        return {port: port for port, is_open in list(self.open.items()) if is_open}


class UpstreamHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Upstream

    def setup(self) -> None:
        super().setup()
        self.server.open[self.client_address[1]] = True

    def finish(self) -> None:
        super().finish()
        self.server.open[self.client_address[1]] = False

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = json.dumps({"client_port": self.client_address[1]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


# --- the apps --------------------------------------------------------------------------------------


@dataclass
class Service:
    """One server an app talks to, seen from that server's side."""

    port: int
    connections: Callable[[], dict[int, int]]  # client port -> server-side id (backend pid, client id)
    key: str  # the field of an answer naming that id; "import_" + key names the one used at import
    exactly_one: bool  # one connection per worker (a WSGI app on one thread); else at least one


@dataclass
class App:
    spec: str
    path: Path
    env: dict[str, str]
    services: list[Service]


@pytest.fixture(params=["django", "sqlalchemy", "fastapi"])
def app(request, postgres, redis, upstream) -> App:
    if request.param == "django":
        pg = Service(postgres.port, lambda: postgres.backends("refork-proof-django"), "backend", True)
        return App("apps.forksafe.django_app:application", FORKSAFE / "django_app.py", postgres.env(), [pg])
    if request.param == "sqlalchemy":
        pg = Service(postgres.port, lambda: postgres.backends("refork-proof-sqlalchemy"), "backend", True)
        cache = Service(redis.port, lambda: redis.clients("refork-proof-flask"), "cache_client", True)
        return App("apps.forksafe.flask_sqlalchemy:app", FORKSAFE / "flask_sqlalchemy.py",
                   {**postgres.env(), **redis.env()}, [pg, cache])
    cache = Service(redis.port, lambda: redis.clients("refork-proof-fastapi"), "backend", False)
    http = Service(upstream.port, upstream.clients, "upstream_port", False)
    return App("apps.forksafe.fastapi_redis:app", FORKSAFE / "fastapi_redis.py",
               {**redis.env(), "REFORK_PROOF_UPSTREAM_URL": f"http://127.0.0.1:{upstream.port}"},
               [cache, http])


def marked_lines(path: Path) -> set[int]:
    return {n for n, line in enumerate(path.read_text().splitlines(), 1) if "# connects at import" in line}


# --- who owns a client socket ------------------------------------------------------------------------


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def loopback_clients_of(service_port: int) -> dict[int, int]:
    """{local port: socket inode} of this host's established TCP connections to 127.0.0.1:service_port."""
    clients = {}
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
            if state == "01" and int(remote.split(":")[1], 16) == service_port and inode:
                clients[int(local.split(":")[1], 16)] = inode
    return clients


def owners(pids: list[int], service_port: int) -> dict[int, set[int]]:
    """{local port: the pids among `pids` holding that connection to the service}."""
    by_inode: dict[int, set[int]] = {}
    for pid in pids:
        for inode in socket_inodes(pid):
            by_inode.setdefault(inode, set()).add(pid)
    return {port: by_inode.get(inode, set()) for port, inode in loopback_clients_of(service_port).items()}


# --- load that records every answer -------------------------------------------------------------------


@dataclass
class Answers:
    """Every (worker pid, server-side connection id) a run produced, and the failed requests."""

    seen: list[dict] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, answer: dict) -> None:
        with self.lock:
            self.seen.append(answer)

    def fail(self, why: str) -> None:
        with self.lock:
            self.failures.append(why)

    def latest_by_worker(self) -> dict[int, dict]:
        with self.lock:
            return {a["worker_pid"]: a for a in self.seen}

    def workers_by_connection(self, key: str) -> dict[int, set[int]]:
        mapping: dict[int, set[int]] = {}
        with self.lock:
            for a in self.seen:
                mapping.setdefault(a[key], set()).add(a["worker_pid"])
        return mapping


HAMMER_THREADS = 3
KILL_CUTS = ("IncompleteRead", "RemoteDisconnected", "ConnectionResetError")  # a response SIGKILL cut


def ask(port: int, conn: http.client.HTTPConnection | None, answers: Answers,
        keep_alive: bool) -> http.client.HTTPConnection | None:
    """One GET / recorded in `answers`; returns the connection to reuse (None: open a fresh one).

    A request that fails on a reused keep-alive connection before any response byte arrived is
    retried once on a fresh one (RFC 9112 §9.3.1; the worker may have been stopped between two
    requests); every other error is a failed request.
    """
    for attempt in (0, 1):
        reused = conn is not None
        if conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/", headers={} if keep_alive else {"Connection": "close"})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"status {resp.status}: {body[:300]!r}")
            answers.add(json.loads(body))
            if resp.will_close or not keep_alive:
                conn.close()
                return None
            return conn
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
            conn.close()
            conn = None
            if reused and attempt == 0:
                continue
            answers.fail(repr(e))
            return None
        except Exception as e:  # noqa: BLE001 - any other error is a failed request
            conn.close()
            answers.fail(repr(e))
            return None
    return None


class Hammer:
    """A few threads sending keep-alive GETs until stopped, every answer recorded."""

    def __init__(self, port: int, answers: Answers, threads: int = HAMMER_THREADS) -> None:
        self.port = port
        self.answers = answers
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        conn = None
        while not self._stop.is_set():
            conn = ask(self.port, conn, self.answers, keep_alive=True)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


# --- the checks ---------------------------------------------------------------------------------------


def ready_workers(server: Server, generation: int) -> list[int]:
    return [w["pid"] for w in server.workers() if w["generation"] == generation]


def each_worker_owns_its_connections(server: Server, app: App, answers: Answers, generation: int) -> None:
    """Poll until the server side shows one connection (at least one) per worker and no other.

    Every client connection the service lists must be held by exactly one process of the tree, a
    ready worker of `generation` (not the mold, not the monitor, not two processes sharing it);
    every such worker must hold its own, and the connection a worker named in its latest answer
    must be one it holds. Fresh (Connection: close) requests are sent meanwhile so that every
    worker gets some.
    """
    deadline = time.monotonic() + 30
    problem = "not checked"
    while time.monotonic() < deadline:
        for _ in range(2 * WORKERS):
            ask(server.port, None, answers, keep_alive=False)
        workers = ready_workers(server, generation)
        tree = [server.proc.pid, *(p["pid"] for p in server.status()["processes"])]
        latest = answers.latest_by_worker()
        problem = next(
            filter(None, (check_ownership(workers, owners(tree, service.port), latest, service)
                          for service in app.services)),
            "",
        )
        if not problem and len(workers) == WORKERS:
            return
        time.sleep(0.05)
    processes = server.status()["processes"]
    roles = {p["pid"]: f"{p['role']} gen {p['generation']} {p['state']}" for p in processes}
    raise AssertionError(f"{problem}\nprocesses: {roles}\n{server.log()[-4000:]}")


def check_ownership(workers: list[int], held: dict[int, set[int]], latest: dict[int, dict],
                    service: Service) -> str:
    """What is wrong with who holds which connection to `service` ('' when nothing is)."""
    per_worker: dict[int, set[int]] = {w: set() for w in workers}
    for port, ident in service.connections().items():
        holders = held.get(port, set())
        if len(holders) > 1:
            return f"connection {ident} (client port {port}) is shared by pids {sorted(holders)}"
        if not holders:
            return f"connection {ident} (client port {port}) is held by no process of the server (yet)"
        (holder,) = holders
        if holder not in per_worker:
            return f"connection {ident} (client port {port}) is held by pid {holder}, not a ready worker"
        per_worker[holder].add(ident)
    for worker, idents in per_worker.items():
        if not idents:
            return f"worker {worker} holds no connection (yet)"
        if service.exactly_one and len(idents) != 1:
            return f"worker {worker} holds {len(idents)} connections: {sorted(idents)}"
        if worker not in latest:
            return f"worker {worker} has not answered yet"
        if latest[worker][service.key] not in idents:
            return f"worker {worker} answered with {latest[worker][service.key]}, but holds {sorted(idents)}"
    return ""


def no_answer_from_another_worker(answers: Answers, app: App) -> None:
    """No connection answered two workers, and none is the one the mold used at import."""
    for service in app.services:
        shared = {c: sorted(w) for c, w in answers.workers_by_connection(service.key).items() if len(w) > 1}
        assert not shared, f"{service.key}: server-side connections that answered several workers: {shared}"
        inherited = [a for a in answers.seen if a[service.key] == a[f"import_{service.key}"]]
        assert not inherited, f"{service.key}: workers answered on the mold's connection: {inherited[:3]}"


# --- the tests ------------------------------------------------------------------------------------


def test_strict_refuses_an_app_that_connects_at_import_and_names_the_line(app):
    result = subprocess.run(
        [sys.executable, "-m", "refork", "-b", f"127.0.0.1:{free_port()}", "--control-socket", "off",
         "--chdir", str(TESTS), "--fork-integrations", "none", "--fork-safety", "strict", app.spec],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **app.env},
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("refork: error: fork safety:")]
    assert len(errors) == 1, result.stderr
    named = {int(n) for n in re.findall(rf"{re.escape(str(app.path))}:(\d+)", errors[0])}
    assert named & marked_lines(app.path), f"no line of {app.path.name} that connects is named:\n{errors[0]}"
    assert "Traceback" not in result.stderr


def test_with_the_integrations_the_strict_ci_guard_accepts_the_app(app):
    result = subprocess.run(
        [sys.executable, "-m", "refork", "--check-config", "--fork-safety", "strict", "--chdir", str(TESTS),
         app.spec],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env={**os.environ, **app.env},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_with_the_integrations_a_strict_server_starts_and_serves(app, start_server):
    """The integrations close what the app opened before the mold's check: nothing left to refuse."""
    server = start_server("--fork-safety", "strict", app=app.spec, workers=1, env=app.env)
    assert server.get("/")[0] == 200
    assert "fork safety: the mold (gen 0) holds" not in server.log()


def test_each_worker_has_its_own_connections_under_load_refork_and_kill(app, start_server):
    server = start_server(app=app.spec, workers=WORKERS, env=app.env)
    answers = Answers()
    hammer = Hammer(server.port, answers)
    try:
        each_worker_owns_its_connections(server, app, answers, generation=0)

        server.signal(signal.SIGUSR2)  # refork: a warm worker becomes the mold of generation 1
        server.wait_for(lambda: server.status()["generation"] >= 1, what="a new generation")
        generation = server.status()["generation"]
        server.wait_for(
            lambda: len(ready_workers(server, generation)) == WORKERS
            and all(w["generation"] == generation for w in server.workers(state=None)),
            what=f"{WORKERS} workers of generation {generation} only",
        )
        each_worker_owns_its_connections(server, app, answers, generation)

        victim = ready_workers(server, generation)[0]
        with answers.lock:
            before_kill = len(answers.failures)
        os.kill(victim, signal.SIGKILL)
        server.wait_for(
            lambda: victim not in (w := ready_workers(server, generation)) and len(w) == WORKERS,
            what="the killed worker replaced",
        )
        each_worker_owns_its_connections(server, app, answers, generation)
    finally:
        hammer.stop()
    lost, cut = answers.failures[:before_kill], answers.failures[before_kill:]
    assert lost == [], lost[:5]  # start, reforks: nothing lost
    # the SIGKILL cuts what the victim was writing (at most one response per hammer connection);
    # any other failure after it is a failure
    assert len(cut) <= HAMMER_THREADS and all(f.startswith(KILL_CUTS) for f in cut), cut[:5]
    no_answer_from_another_worker(answers, app)
    assert len({a["worker_pid"] for a in answers.seen}) >= 2 * WORKERS  # two generations answered


def test_no_worker_ever_gets_another_workers_answer(app, start_server):
    """Many interleaved requests, fresh and keep-alive: each connection answers one worker only."""
    server = start_server(app=app.spec, workers=WORKERS, env=app.env)
    answers = Answers()

    def client(keep_alive: bool) -> None:
        conn = None
        for _ in range(25):
            conn = ask(server.port, conn, answers, keep_alive)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=client, args=(n % 2 == 0,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers.failures == [], answers.failures[:5]
    assert len(answers.seen) == 8 * 25
    assert len({a["worker_pid"] for a in answers.seen}) > 1
    no_answer_from_another_worker(answers, app)
