"""Hello-world throughput: refork vs gunicorn, uvicorn, granian and bjoern.

Every server runs 2 workers on 127.0.0.1. Servers are interleaved within each round and the
median over rounds is reported, so all competitors share the same (noisy) machine conditions.

    python benchmarks/hello.py [--python 3.12] [--duration 10] [--rounds 3] [--only refork-wsgi,uvicorn]

--base DIR adds refork-wsgi@base and refork-asgi@base: refork run from another checkout (say the
commit before a refactor, `git worktree add /tmp/base HEAD~1` and `python setup.py build_ext
--inplace` there), interleaved with the rest, and prints this tree's ratio against it.
"""

from __future__ import annotations

import time
from pathlib import Path

from common import (
    BENCH_DIR,
    Server,
    announce,
    bench_parser,
    chosen,
    finish,
    fmt,
    print_wrk_table,
    refork_cmd,
    rps_ratio,
    run_rounds,
    run_wrk,
    write_results,
    wrk_line,
    wrk_summary,
)

APPS = BENCH_DIR / "apps"
BASELINE = {"wsgi": "gunicorn-gthread", "asgi": "uvicorn"}
TARGETS = [("refork-wsgi", BASELINE["wsgi"], 3.0), ("refork-asgi", BASELINE["asgi"], 1.0)]


def servers(venv: Path, port: int, base: Path | None = None) -> list[Server]:
    """All contenders, in run order. Ports are port, port+1, ..."""
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    refork = [*refork_cmd(venv), "-w", "2", "--chdir", str(APPS), "-b", f"{bind}:{{port}}"]
    gunicorn = [str(bin_ / "gunicorn"), "-w", "2", "-b", f"{bind}:{{port}}", "--log-level", "warning"]
    uvicorn = [str(bin_ / "uvicorn"), "--workers", "2", "--http", "httptools", "--loop", "uvloop",
               "--no-access-log", "--log-level", "warning", "--host", bind, "--port", "{port}"]
    granian = [str(bin_ / "granian"), "--workers", "2", "--host", bind, "--port", "{port}",
               "--no-ws", "--log-level", "warning"]
    bjoern = [str(bin_ / "python"), str(APPS / "bjoern_run.py")]
    specs = [
        ("refork-wsgi", "wsgi", [*refork, "hello_wsgi:app"]),
        ("refork-wsgi-threads", "wsgi", [*refork, "--threads", "4", "hello_wsgi:app"]),
        ("refork-asgi", "asgi", [*refork, "--interface", "asgi", "hello_asgi:app"]),
        ("gunicorn-sync", "wsgi", [*gunicorn, "hello_wsgi:app"]),
        ("gunicorn-gthread", "wsgi", [*gunicorn, "-k", "gthread", "--threads", "4", "hello_wsgi:app"]),
        ("uvicorn", "asgi", [*uvicorn, "hello_asgi:app"]),
        ("granian-wsgi", "wsgi", [*granian, "--interface", "wsgi", "hello_wsgi:app"]),
        ("granian-asgi", "asgi", [*granian, "--interface", "asgi", "hello_asgi:app"]),
        ("bjoern", "wsgi", [*bjoern, "hello_wsgi:app", bind, "{port}", "2"]),
    ]
    envs: dict[str, dict[str, str]] = {}
    if base is not None:
        old = [str(bin_ / "python"), "-m", "refork", *refork[len(refork_cmd(venv)):]]
        specs += [
            ("refork-wsgi@base", "wsgi", [*old, "hello_wsgi:app"]),
            ("refork-asgi@base", "asgi", [*old, "--interface", "asgi", "hello_asgi:app"]),
        ]
        envs = {name: {"PYTHONPATH": str(base)} for name, _, _ in specs[-2:]}
    return [
        Server(name, iface, [a.replace("{port}", str(port + i)) for a in argv], port + i, APPS,
               env=envs.get(name, {}))
        for i, (name, iface, argv) in enumerate(specs)
    ]


def bench_one(server: Server, duration: float) -> dict:
    """Start, warm up 2 s, measure, stop, check for leftovers."""
    error = server.start()
    if error:
        server.stop()
        return {"error": error}
    workers = len(server.pids()) - 1
    run_wrk(server.port, 2)
    result = run_wrk(server.port, duration)
    result["processes"] = workers + 1
    return finish(server, result)


def main() -> None:
    parser = bench_parser(__doc__, duration=10.0, port=19000)
    parser.add_argument("--base", type=Path, help="another refork checkout, run as refork-*@base")
    args = parser.parse_args()
    base = args.base.resolve() if args.base else None

    venv, info = announce(args.python)
    wanted = chosen([s.name for s in servers(venv, args.port, base)], args.only)
    runs, failed = run_rounds(
        args.rounds,
        lambda rnd: servers(venv, args.port + 20 * rnd, base),
        wanted,
        lambda server: bench_one(server, args.duration),
        wrk_line,
    )
    ifaces = {s.name: s.interface for s in servers(venv, 0, base)}
    summary = wrk_summary(wanted, runs, failed, ifaces)

    print(f"\nmedian of {args.rounds} rounds, {args.duration:g}s each, wrk -t2 -c64 keep-alive, 2 workers, "
          f"Python {info.get('python')}")
    print_wrk_table(summary, BASELINE)

    checks = {}
    print()
    for name, ref, target in TARGETS:
        if name not in summary or ref not in summary:
            continue
        r = rps_ratio(summary, name, ref)
        ok = r is not None and r >= target
        checks[name] = {"baseline": ref, "target": target, "ratio": r, "pass": ok}
        print(f"[{'PASS' if ok else 'FAIL'}] {name} >= {target:.1f}x {ref}: {fmt(r, '.2f', 'x')}")

    for name in ("refork-wsgi", "refork-asgi"):
        mine, old = summary.get(name, {}).get("rps"), summary.get(f"{name}@base", {}).get("rps")
        if mine and old:
            pairs = zip(runs[name], runs[f"{name}@base"], strict=False)
            per_round = [a["rps"] / b["rps"] for a, b in pairs]
            checks[f"{name} vs base"] = {"ratio": mine / old, "per_round": per_round}
            rounds = ", ".join(f"{r:.3f}" for r in per_round)
            print(f"{name} / {name}@base: {mine / old:.3f}x (per round: {rounds})")

    path = write_results("hello", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "duration": args.duration,
        "rounds": args.rounds, "runs": runs, "summary": summary, "checks": checks,
    })
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
