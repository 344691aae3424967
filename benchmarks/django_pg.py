"""Django + PostgreSQL, 2 workers x 100 threads: refork's native and Python loops against granian
and gunicorn gthread.

The app (benchmarks/django_pg_app/, settings in code): `/` does two ORM queries, waits 50 ms
(`time.sleep(0.05)`, standing for an upstream call) and renders a template; `/slow` sleeps 3 s.
PostgreSQL is Debian's package: the script makes a throw-away cluster in a temporary directory
(initdb, trust auth, 127.0.0.1 on a free port, max_connections 400; run as the `postgres` user
when root), fills two tables, and stops and removes it at the end.

Each round, for each server (order alternating between rounds): start, warm up 3 s with the full
load (every thread gets its connection), then the measured run: `wrk -t2 -c180 -d<D>s --latency`
on `/` while 20 more connections each hold a `/slow` request, one after the other, for the whole
run (client threads in this script). Reported: req/s, p50/p90/p99, wrk's socket errors and non-2xx
answers, the `/slow` requests completed and failed, CPU per `/` request (utime + stime of the
server's process tree over the run, divided by wrk's requests), the PostgreSQL connections open at
the end. Medians over rounds; ratios against granian. Targets: refork >= 1.15x granian, p90 <=
600 ms, no errors.

    python3 benchmarks/django_pg.py [--python 3.11] [--duration 20] [--rounds 3] [--only a,b]
                                    [--conn persistent|pool]

--conn pool uses Django's psycopg pool (100 connections per process) instead of a persistent
connection per thread (CONN_MAX_AGE 600, the default).
"""

from __future__ import annotations

import glob
import http.client
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import (
    BENCH_DIR,
    WRK_UNITS,
    Server,
    add_profile_options,
    announce,
    bench_parser,
    chosen,
    finish,
    fmt,
    free_port,
    median,
    print_table,
    refork_cmd,
    rps_ratio,
    run_rounds,
    summarize,
    write_results,
)
from native_hello import TreeCost, check_loop, profile

APP = "django_pg_app.app:application"
BASELINE = "granian-wsgi"
TARGET_RATIO, TARGET_P90_MS = 1.15, 600.0
AUTHORS, ARTICLES_PER_AUTHOR = 100, 20


# --------------------------------------------------------------------------- PostgreSQL


class Postgres:
    """A throw-away cluster on 127.0.0.1, trust auth, one database `bench` owned by role `bench`."""

    def __init__(self) -> None:
        dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda d: int(d.split("/")[-3]))
        if not dirs:
            sys.exit(
                "PostgreSQL is not installed: apt-get install postgresql (benchmarks/setup.sh does, as root)"
            )
        self.bin_dir = os.path.dirname(dirs[-1])
        self.root = tempfile.mkdtemp(prefix="bench-pg-")
        self.data = os.path.join(self.root, "data")
        self.port = free_port()
        # PostgreSQL refuses to run as root: then run it as the `postgres` system user.
        self.run_as = "postgres" if os.geteuid() == 0 else None
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)

    def _run(self, *args: str) -> None:
        result = subprocess.run(
            [os.path.join(self.bin_dir, args[0]), *args[1:]],
            user=self.run_as,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
            )

    def start(self) -> None:
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=400 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=64MB"
        )
        self._run(
            "pg_ctl",
            "-D",
            self.data,
            "-l",
            os.path.join(self.root, "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        self.sql("CREATE ROLE bench LOGIN", database="postgres")
        self.sql("CREATE DATABASE bench OWNER bench", database="postgres")
        self.sql(
            f"""
            CREATE TABLE django_pg_app_author (id bigserial PRIMARY KEY, name varchar(100) NOT NULL,
                                               bio text NOT NULL);
            CREATE TABLE django_pg_app_article (
                id bigserial PRIMARY KEY,
                author_id bigint NOT NULL REFERENCES django_pg_app_author(id),
                title varchar(200) NOT NULL, summary text NOT NULL,
                published timestamptz NOT NULL, views integer NOT NULL);
            CREATE INDEX ON django_pg_app_article (author_id, published);
            INSERT INTO django_pg_app_author (name, bio)
                SELECT 'author number ' || i, repeat('A few words about this author. ', 10)
                FROM generate_series(1, {AUTHORS}) AS i;
            INSERT INTO django_pg_app_article (author_id, title, summary, published, views)
                SELECT 1 + (i % {AUTHORS}), 'Article ' || i || ': on servers and threads',
                       repeat('Some text that summarises the article at some length. ', 5),
                       now() - (i || ' hours')::interval, (i * 7919) % 1000
                FROM generate_series(1, {AUTHORS * ARTICLES_PER_AUTHOR}) AS i;
            ANALYZE;
        """,
            user="bench",
        )

    def sql(self, query: str, database: str = "bench", user: str = "postgres") -> list[str]:
        result = subprocess.run(
            [
                os.path.join(self.bin_dir, "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                user,
                "-d",
                database,
                "-c",
                query,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql failed:\n{result.stderr}")
        return result.stdout.splitlines()

    def backends(self) -> int:
        rows = self.sql("SELECT count(*) FROM pg_stat_activity WHERE datname = 'bench' AND usename = 'bench'")
        return int(rows[0]) if rows else 0

    def stop(self) -> None:
        try:
            if os.path.exists(os.path.join(self.data, "postmaster.pid")):
                self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def env(self) -> dict[str, str]:
        return {
            "BENCH_PG_HOST": "127.0.0.1",
            "BENCH_PG_PORT": str(self.port),
            "BENCH_PG_DB": "bench",
            "BENCH_PG_USER": "bench",
            "BENCH_AUTHORS": str(AUTHORS),
        }


# --------------------------------------------------------------------------- load


def wrk(port: int, duration: float, connections: int, path: str = "/") -> dict:
    """wrk -t2 with --latency: req/s, requests, p50/p90/p99 ms, socket errors, non-2xx answers."""
    cmd = [
        "wrk",
        "-t2",
        f"-c{connections}",
        f"-d{duration:g}s",
        "--timeout=10s",
        "--latency",
        f"http://127.0.0.1:{port}{path}",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60).stdout
    res: dict = {"rps": 0.0, "requests": 0, "errors": 0, "non2xx": 0}
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        res["rps"] = float(m.group(1))
    if m := re.search(r"(\d+) requests in", out):
        res["requests"] = int(m.group(1))
    for pct in ("50", "90", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
        res[f"p{pct}_ms"] = float(m.group(1)) * WRK_UNITS[m.group(2)] if m else None
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        res["errors"] = sum(int(x) for x in m.groups())
        res["socket_errors"] = m.group(0)
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        res["non2xx"] = int(m.group(1))
    return res


class SlowHolders:
    """`count` keep-alive connections, each sending GET /slow again as soon as the last one ends."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = self.failed = 0
        self.samples: list[str] = []
        self.seconds: list[float] = []  # how long each answered /slow took (3 s in the app)
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                began = time.monotonic()
                conn.request("GET", "/slow")
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
                error = f"HTTP {resp.status}"
                if resp.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                ok, error = False, f"{type(exc).__name__}: {exc}"
                if conn is not None:
                    conn.close()
                conn = None
            with self.lock:
                if ok:
                    self.done += 1
                    self.seconds.append(time.monotonic() - began)
                else:
                    self.failed += 1
                    if len(self.samples) < 5:
                        self.samples.append(error)
        if conn is not None:
            conn.close()

    def __enter__(self) -> SlowHolders:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()  # each thread ends after its current 3 s request
        for t in self.threads:
            t.join(35)


# --------------------------------------------------------------------------- servers


def servers(
    venv: Path, port: int, env: dict[str, str], threads: int, refork_path: Path | None = None
) -> list[Server]:
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    refork = [
        *refork_cmd(venv),
        "-w",
        "2",
        "--threads",
        str(threads),
        "--chdir",
        str(BENCH_DIR),
        "-b",
        f"{bind}:{{port}}",
    ]
    specs = [
        ("refork-native", [*refork, "--wsgi-loop", "native", APP]),
        ("refork-python", [*refork, "--wsgi-loop", "python", APP]),
        # a GIL switch interval of 20 ms in place of Python's 5 ms (docs/native.md: the trade-off)
        ("refork-native-20ms", [*refork, "--wsgi-loop", "native", "--switch-interval", "0.02", APP]),
        (
            "granian-wsgi",
            [
                str(bin_ / "granian"),
                "--interface",
                "wsgi",
                "--workers",
                "2",
                "--blocking-threads",
                str(threads),
                "--host",
                bind,
                "--port",
                "{port}",
                "--no-ws",
                "--log-level",
                "warning",
                APP,
            ],
        ),
        (
            "gunicorn-gthread",
            [
                str(bin_ / "gunicorn"),
                "-w",
                "2",
                "-k",
                "gthread",
                "--threads",
                str(threads),
                "-b",
                f"{bind}:{{port}}",
                "--log-level",
                "warning",
                APP,
            ],
        ),
    ]
    return [
        Server(
            name,
            "wsgi",
            [a.replace("{port}", str(port + i)) for a in argv],
            port + i,
            BENCH_DIR,
            env={**env, "PYTHONPATH": str(refork_path)} if refork_path and name.startswith("refork") else env,
        )
        for i, (name, argv) in enumerate(specs)
    ]


def bench_one(server: Server, pg: Postgres, duration: float, connections: int, slow: int) -> dict:
    if error := server.start(timeout=90) or check_loop(server):
        server.stop()
        return {"error": error}
    wrk(server.port, 3, connections)  # warm-up: imports, template cache, one DB connection per thread
    cost = TreeCost(server)
    with SlowHolders(server.port, slow) as holders:
        time.sleep(0.5)  # the slow requests are in the app before the measured run starts
        with cost:
            res = wrk(server.port, duration, connections)
        res["pg_backends"] = pg.backends()
    res.update(cost.per_request(res["requests"]))
    res.update(
        slow_done=holders.done,
        slow_failed=holders.failed,
        slow_samples=holders.samples,
        slow_s=median(holders.seconds) if holders.seconds else None,
        processes=len(cost.pids),
    )
    return finish(server, res, grace=15)


def describe(res: dict) -> str:
    """The line(s) one measured run prints."""
    line = (
        f"{res['rps']:.0f} req/s, p50/p90/p99 {fmt(res['p50_ms'], '.0f')}/"
        f"{fmt(res['p90_ms'], '.0f')}/"
        f"{fmt(res['p99_ms'], '.0f')} ms, errors {res['errors']}+{res['non2xx']} non-2xx, "
        f"slow {res['slow_done']} ok {res['slow_failed']} failed "
        f"({fmt(res.get('slow_s'), '.2f')} s median), "
        f"cpu {res['user_us']:.0f}+{res['sys_us']:.0f} us/req, "
        f"cswitch {fmt(res.get('cswitch_per_req'), '.1f')}/req, pg {res['pg_backends']}"
    )
    return line + (f"\n  slow errors: {res['slow_samples']}" if res["slow_samples"] else "")


def medians(rs: list[dict]) -> dict:
    """A server's summary: medians over its rounds (and each round's req/s), counts summed."""
    return {
        "rps": median([r["rps"] for r in rs]),
        "rounds": [round(r["rps"]) for r in rs],
        **{k: median([r[k] for r in rs]) for k in ("p50_ms", "p90_ms", "p99_ms", "user_us", "sys_us")},
        "errors": sum(r["errors"] + r["non2xx"] for r in rs),
        "slow_done": sum(r["slow_done"] for r in rs),
        "slow_failed": sum(r["slow_failed"] for r in rs),
        "slow_s": median([r["slow_s"] for r in rs if r.get("slow_s") is not None]),
        "cswitch_per_req": median([r.get("cswitch_per_req") for r in rs]),
        "syscalls_per_req": median([r.get("syscalls_per_req") for r in rs]),
        "pg_backends": max(r["pg_backends"] for r in rs),
    }


def main() -> None:
    parser = bench_parser(__doc__, duration=20.0, port=19500)
    parser.add_argument("--connections", type=int, default=180, help="wrk connections on /")
    parser.add_argument("--slow", type=int, default=20, help="connections holding 3 s requests on /slow")
    parser.add_argument(
        "--threads", type=int, default=100, help="threads per worker (granian: blocking threads)"
    )
    parser.add_argument(
        "--conn",
        choices=("persistent", "pool"),
        default="persistent",
        help="Django's connections: one per thread (CONN_MAX_AGE) or psycopg's pool",
    )
    add_profile_options(parser)
    args = parser.parse_args()

    venv, info = announce(args.python, command=True)
    wanted = chosen([s.name for s in servers(venv, args.port, {}, args.threads)], args.only)

    pg = Postgres()
    loads = [os.getloadavg()[0]]
    try:
        pg.start()
        env = {**pg.env(), "BENCH_PG_CONN": args.conn, "BENCH_PG_POOL": str(args.threads)}
        runs, failed = run_rounds(
            args.rounds,
            lambda rnd: servers(venv, args.port + 10 * rnd, env, args.threads, args.refork_path),
            wanted,
            lambda server: bench_one(server, pg, args.duration, args.connections, args.slow),
            describe,
            after_round=lambda: loads.append(os.getloadavg()[0]),
        )
        if args.profile:
            for server in servers(venv, args.port + 10 * args.rounds, env, args.threads, args.refork_path):
                if server.name not in wanted or server.name in failed or server.start(timeout=90):
                    server.stop()
                    continue
                wrk(server.port, 3, args.connections)

                def load(duration: float, port: int = server.port) -> None:
                    with SlowHolders(port, args.slow):
                        wrk(port, duration, args.connections)

                print()
                print("\n".join(profile(server, venv, args.profile, load, app_frame="WSGIHandler.__call__")))
                server.stop(grace=15)
    finally:
        pg.stop()

    summary = summarize(wanted, runs, failed, medians)

    def ratio(name: str) -> float | None:
        return rps_ratio(summary, name, BASELINE)

    print(
        f"\nmedian of {args.rounds} rounds, {args.duration:g}s each, wrk -t2 -c{args.connections} on / + "
        f"{args.slow} connections looping on /slow (3 s), 2 workers x {args.threads} threads, "
        f"DB connections: {args.conn}, Python {info.get('python')}; "
        f"load average {', '.join(f'{x:.1f}' for x in loads)}"
    )
    rows = []
    for name, s in summary.items():
        if "error" in s:
            rows.append([name] + ["-"] * 13 + [s["error"]])
            continue
        rows.append(
            [
                name,
                f"{s['rps']:.0f}",
                " ".join(map(str, s["rounds"])),
                fmt(s["p50_ms"], ".0f"),
                fmt(s["p90_ms"], ".0f"),
                fmt(s["p99_ms"], ".0f"),
                str(s["errors"]),
                f"{s['slow_done']}/{s['slow_failed']}",
                fmt(s["slow_s"], ".2f"),
                f"{s['user_us']:.0f}+{s['sys_us']:.0f}",
                fmt(s["syscalls_per_req"], ".1f"),
                fmt(s["cswitch_per_req"], ".1f"),
                str(s["pg_backends"]),
                fmt(ratio(name), ".2f", "x"),
                "",
            ]
        )
    print_table(
        [
            "server",
            "req/s",
            "rounds",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "errors",
            "slow ok/failed",
            "slow s (median)",
            "cpu us/req (u+s)",
            "syscalls/req",
            "cswitch/req",
            "pg conns",
            f"vs {BASELINE}",
            "note",
        ],
        rows,
    )

    checks: dict[str, dict] = {}
    print()
    for name in ("refork-native", "refork-python"):
        s = summary.get(name)
        if not s or "error" in s or BASELINE not in summary or "error" in summary[BASELINE]:
            continue
        r = ratio(name)
        ok_r = r is not None and r >= TARGET_RATIO
        ok_p90 = s["p90_ms"] is not None and s["p90_ms"] <= TARGET_P90_MS
        ok_err = s["errors"] == 0 and s["slow_failed"] == 0
        checks[name] = {
            "ratio": r,
            "p90_ms": s["p90_ms"],
            "errors": s["errors"],
            "slow_failed": s["slow_failed"],
            "pass": ok_r and ok_p90 and ok_err,
        }
        print(f"[{'PASS' if ok_r else 'FAIL'}] {name} >= {TARGET_RATIO}x {BASELINE}: {fmt(r, '.2f', 'x')}")
        print(
            f"[{'PASS' if ok_p90 else 'FAIL'}] {name} p90 <= {TARGET_P90_MS:.0f} ms: "
            f"{fmt(s['p90_ms'], '.0f')} ms"
        )
        print(
            f"[{'PASS' if ok_err else 'FAIL'}] {name} no errors: {s['errors']} on /, "
            f"{s['slow_failed']} on /slow"
        )

    path = write_results(
        "django-pg",
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "argv": sys.argv,
            "versions": info,
            "loads": loads,
            "duration": args.duration,
            "rounds": args.rounds,
            "conn": args.conn,
            "threads": args.threads,
            "runs": runs,
            "summary": summary,
            "checks": checks,
        },
    )
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
