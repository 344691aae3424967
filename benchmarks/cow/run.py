"""Copy-on-write memory benchmark on the generated monolith.

Serves benchmarks/monolith_generated (make_monolith.py) with refork and its peers, 4 workers each,
one after another; sends every server the same warm load; then measures the whole process tree
from /proc: total PSS and per-worker USS. "One copy" is the RSS of the single worker of a
1-worker gunicorn (no preload) after the same load; "one copy, trimmed" is the total PSS of a
1-worker tuned gunicorn (--preload, collect + freeze + malloc_trim(0)), the least one process
serving the app takes.

    python benchmarks/cow/run.py --python 3.12 [--requests-per-worker 1000] [--only refork,gunicorn-preload]

--monolith NAME serves another generated package under benchmarks/ (make_monolith.py --out), e.g.
monolith_specializable (make_monolith.py --code specializable).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import (  # noqa: E402
    BENCH_DIR,
    Server,
    announce,
    fmt,
    median,
    print_table,
    refork_cmd,
    role,
    script_parser,
    send_requests,
    smaps_rollup,
    uss_kib,
    wait_stable,
    write_results,
)

DEFAULT_MONOLITH = "monolith_generated"
FREEZE_CONF = Path(__file__).resolve().parent / "gunicorn_freeze.conf.py"
TRIM_CONF = Path(__file__).resolve().parent / "gunicorn_trim.conf.py"
BASELINE = "gunicorn-preload-freeze"
TUNED = "gunicorn-preload-freeze-trim"
ONE_COPY_TRIMMED = "one-copy-trimmed"
REFERENCES = ("one-copy", ONE_COPY_TRIMMED)  # always run: the ratios are against them


ONE_GENERATION = ["--refork-after", "off", "--mold-idle-exit", "off"]  # no refork, the mold kept
REFORK_200_400 = ["--refork-after", "200,400"]


def warm_paths(n: int) -> list[str]:
    return [f"/w/{i}" for i in range(n)]


def servers(venv: Path, workers: int, port: int, warmup: list[str], monolith: str) -> list[Server]:
    app = f"{monolith}.app:app"
    bind = "127.0.0.1"
    b = venv / "bin"
    refork = [*refork_cmd(venv), "-w", str(workers), "--chdir", str(BENCH_DIR), "-b", f"{bind}:{{port}}"]
    warm = [arg for path in warmup for arg in ("--warmup", path)]
    gunicorn = [str(b / "gunicorn"), "-b", f"{bind}:{{port}}", "--log-level", "warning", "--timeout", "120"]
    specs = [
        ("one-copy", [*gunicorn, "-w", "1", app]),
        (ONE_COPY_TRIMMED, [*gunicorn, "-w", "1", "--preload", "-c", str(TRIM_CONF), app]),
        ("refork", [*refork, app]),  # the defaults: --refork-after 50,100,1000 --mold-idle-exit auto
        ("refork-one-generation", [*refork, *ONE_GENERATION, app]),
        ("refork-warmup", [*refork, *ONE_GENERATION, *warm, app]),
        ("refork-after", [*refork, *REFORK_200_400, "--mold-idle-exit", "off", app]),
        ("refork-warmup-after", [*refork, *warm, *REFORK_200_400, "--mold-idle-exit", "off", app]),
        ("refork-idle-exit", [*refork, "--refork-after", "off", "--mold-idle-exit", "1", app]),
        ("refork-after-idle-exit", [*refork, *REFORK_200_400, "--mold-idle-exit", "1", app]),
        ("gunicorn", [*gunicorn, "-w", str(workers), app]),
        ("gunicorn-preload", [*gunicorn, "-w", str(workers), "--preload", app]),
        (BASELINE, [*gunicorn, "-w", str(workers), "--preload", "-c", str(FREEZE_CONF), app]),
        (TUNED, [*gunicorn, "-w", str(workers), "--preload", "-c", str(TRIM_CONF), app]),
        ("granian", [str(b / "granian"), "--interface", "wsgi", "--workers", str(workers), "--host", bind,
                     "--port", "{port}", "--no-ws", "--log-level", "warning", app]),
    ]
    return [
        Server(name, "wsgi", [a.replace("{port}", str(port + i)) for a in argv], port + i, BENCH_DIR)
        for i, (name, argv) in enumerate(specs)
    ]


def measure(server: Server, min_procs: int) -> dict:
    """PSS/USS of every process in the tree, with its role."""
    assert server.proc is not None
    root = server.proc.pid
    procs = []
    for pid in wait_stable(server, min_procs):
        try:
            f = smaps_rollup(pid)
        except OSError:
            continue
        procs.append({"pid": pid, "role": role(pid, root), "rss": f.get("Rss", 0), "pss": f.get("Pss", 0),
                      "uss": uss_kib(f), "private_dirty": f.get("Private_Dirty", 0)})
    workers = [p for p in procs if p["role"] == "worker"] or [p for p in procs if p["role"] == "other"]
    return {
        "processes": procs,
        "total_pss": sum(p["pss"] for p in procs),
        "workers": len(workers),
        "worker_uss": median([p["uss"] for p in workers]),
        "worker_private_dirty": median([p["private_dirty"] for p in workers]),
        "worker_rss": median([p["rss"] for p in workers]),
    }


def worker_pids(server: Server) -> set[int]:
    assert server.proc is not None
    return {pid for pid in server.pids() if role(pid, server.proc.pid) == "worker"}


def bench_one(server: Server, workers: int, requests: int, paths: list[str]) -> dict:
    error = server.start(timeout=180.0, path="/mem")
    if error:
        server.stop()
        return {"error": error}
    try:
        wait_stable(server, workers + 1)
        load = send_requests(server.port, paths, requests, concurrency=2 * workers, keepalive=False)
        # Reforks triggered by the load may leave fresh workers that served nothing: once the tree
        # is stable again, send a quarter more so every measured worker has served requests. The
        # quarter may itself trigger a refork (--refork-after repeats its last number): then once
        # more, until a quarter ends with the workers it started with (at most 4 times).
        for _ in range(4):
            wait_stable(server, workers + 1)
            before = worker_pids(server)
            more = send_requests(server.port, paths[::-1], requests // 4, 2 * workers, keepalive=False)
            for key in ("requests", "errors", "seconds", "error_samples"):
                load[key] += more[key]
            wait_stable(server, workers + 1)
            if worker_pids(server) == before:
                break
        load["rps"] = load["requests"] / load["seconds"]
        result = measure(server, workers + 1)
        result["load"] = load
    finally:
        leaked = server.stop()
    if leaked:
        result["leaked_pids"] = leaked
    return result


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--requests-per-worker", type=int, default=1000)
    parser.add_argument("--warm-paths", type=int, default=20, help="/w/0.. paths, also refork's --warmup")
    parser.add_argument("--load-paths", type=int, default=300, help="extra /r/0.. paths only the load sends")
    parser.add_argument("--only", help="comma-separated server names (one-copy and one-copy-trimmed "
                                       "are always run)")
    parser.add_argument("--port", type=int, default=19500)
    parser.add_argument("--monolith", "--app-dir", default=DEFAULT_MONOLITH, metavar="NAME",
                        help="generated package to serve, a directory under benchmarks/ "
                             "(make_monolith.py --out); default: %(default)s")
    args = parser.parse_args()

    monolith = Path(args.monolith).name
    if not (BENCH_DIR / monolith / "app.py").exists():
        sys.exit(f"benchmarks/{monolith} is missing: run benchmarks/cow/make_monolith.py"
                 + ("" if monolith == DEFAULT_MONOLITH else f" --out benchmarks/{monolith}") + " first")
    venv, info = announce(args.python)
    print(f"app: {monolith}.app:app")
    # Compile the generated package for this interpreter once, outside any measurement.
    subprocess.run([str(venv / "bin" / "python"), "-m", "compileall", "-q", monolith],
                   cwd=BENCH_DIR, check=True)

    warmup = warm_paths(args.warm_paths)
    paths = warmup + [f"/r/{i}" for i in range(args.load_paths)]
    all_servers = servers(venv, args.workers, args.port, warmup, monolith)
    wanted = {*REFERENCES, *(args.only.split(",") if args.only else [s.name for s in all_servers])}
    unknown = wanted - {s.name for s in all_servers}
    if unknown:
        sys.exit(f"unknown server(s): {', '.join(sorted(unknown))}")
    total_requests = args.workers * args.requests_per_worker  # plus a quarter after reforks settle

    results: dict[str, dict] = {}
    for server in all_servers:
        if server.name not in wanted:
            continue
        print(f"{server.name}: {' '.join(server.argv[1:])}", flush=True)
        t0 = time.monotonic()
        n_workers = 1 if server.name in REFERENCES else args.workers
        res = bench_one(server, n_workers, total_requests, paths)
        results[server.name] = res
        if "error" in res:
            print(f"  {res['error']}")
            continue
        load = res["load"]
        print(f"  {load['requests']} requests, {load['rps']:.0f} req/s, {load['errors']} errors; "
              f"total PSS {res['total_pss'] / 1024:.1f} MiB in {len(res['processes'])} processes "
              f"({time.monotonic() - t0:.0f}s)")
        for sample in load["error_samples"]:
            print(f"    error: {sample}")
        for p in res["processes"]:
            mib = {k: p[k] / 1024 for k in ("rss", "pss", "uss", "private_dirty")}
            print(f"    pid {p['pid']:>7} {p['role']:<7} RSS {mib['rss']:7.1f}  PSS {mib['pss']:7.1f}  "
                  f"USS {mib['uss']:7.1f}  Private_Dirty {mib['private_dirty']:7.1f} MiB")

    one = results.get("one-copy", {}).get("worker_rss")
    trimmed = results.get(ONE_COPY_TRIMMED, {}).get("total_pss")
    base = results.get(BASELINE, {}).get("total_pss")
    tuned = results.get(TUNED, {}).get("total_pss")
    preload = results.get("gunicorn-preload", {}).get("total_pss")

    def ratio(a: float | None, b: float | None) -> str:
        return fmt(a / b if a and b else None, ".2f", "x")

    print(f"\n{args.workers} workers, {total_requests} + {total_requests // 4} requests (a quarter more "
          "again after each refork), "
          f"Python {info.get('python')}; "
          f"one copy = {fmt(one and one / 1024)} MiB (RSS of a 1-worker gunicorn worker), "
          f"one copy, trimmed = {fmt(trimmed and trimmed / 1024)} MiB "
          "(total PSS of a 1-worker tuned gunicorn)")
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", "-", r["error"]])
            continue
        rows.append([name, f"{r['total_pss'] / 1024:.1f}", fmt(r["worker_uss"] and r["worker_uss"] / 1024),
                     fmt(r["worker_private_dirty"] and r["worker_private_dirty"] / 1024),
                     *(ratio(r["total_pss"], ref) for ref in (one, trimmed, preload, base, tuned)), ""])
    print_table(["server", "total PSS MiB", "worker USS MiB", "worker Priv_Dirty MiB", "x one copy",
                 "x one copy trimmed", "vs preload", "vs preload+freeze", "vs tuned", "note"], rows)

    checks: dict[str, dict] = {}
    py312 = tuple(int(x) for x in info.get("python", "0.0").split(".")[:2]) >= (3, 12)
    print()
    for name, r in results.items():
        if not name.startswith("refork"):
            continue
        pss = r.get("total_pss")
        targets = ([("one copy, trimmed", trimmed, 1.00), ("tuned gunicorn", tuned, 0.55)] if py312
                   else [("gunicorn --preload", preload, 0.80)])
        for label, ref, limit in targets:
            if ref is None:  # that peer was not run (--only) or failed
                print(f"[----] {name} total PSS <= {limit:.2f}x {label}: not measured")
                continue
            value = pss / ref if pss else None
            ok = value is not None and value <= limit
            checks[f"{name} vs {label}"] = {"ratio": value, "limit": limit, "pass": ok}
            verdict = "PASS" if ok else "FAIL"
            print(f"[{verdict}] {name} total PSS <= {limit:.2f}x {label}: {fmt(value, '.2f', 'x')}")

    suffix = "" if monolith == DEFAULT_MONOLITH else f"-{monolith}"
    path = write_results(f"cow-py{info.get('python')}{suffix}", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "monolith": monolith,
        "workers": args.workers,
        "requests": total_requests, "paths": len(paths), "results": results, "checks": checks,
        "one_copy_kib": one, "one_copy_trimmed_kib": trimmed,
    })
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
