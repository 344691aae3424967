"""Hello-world throughput: refork vs gunicorn, uvicorn, granian and bjoern (issue 2).

Every server runs 2 workers on 127.0.0.1. Servers are interleaved within each round and the
median over rounds is reported, so all competitors share the same (noisy) machine conditions.

    python benchmarks/hello.py [--python 3.12] [--duration 10] [--rounds 3] [--only refork-wsgi,uvicorn]

--base DIR adds refork-wsgi@base and refork-asgi@base: refork run from another checkout (say the
commit before a refactor, `git worktree add /tmp/base HEAD~1` and `python setup.py build_ext
--inplace` there), interleaved with the rest, and prints this tree's ratio against it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from common import (
    BENCH_DIR,
    Server,
    fmt,
    median,
    print_table,
    refork_cmd,
    run_wrk,
    venv_dir,
    versions,
    write_results,
)

APPS = BENCH_DIR / "apps"
WSGI_BASELINE, ASGI_BASELINE = "gunicorn-gthread", "uvicorn"
TARGETS = [("refork-wsgi", WSGI_BASELINE, 3.0), ("refork-asgi", ASGI_BASELINE, 1.0)]


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
    leaked = server.stop()
    result["processes"] = workers + 1
    if leaked:
        result["leaked_pids"] = leaked
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", help="interpreter version or path; selects benchmarks/.venv-X.Y")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of measured load per server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma-separated server names")
    parser.add_argument("--port", type=int, default=19000, help="first port; each round uses a fresh range")
    parser.add_argument("--base", type=Path, help="another refork checkout, run as refork-*@base")
    args = parser.parse_args()
    base = args.base.resolve() if args.base else None

    venv = venv_dir(args.python)
    info = versions(venv)
    print("versions:", ", ".join(f"{k} {v}" for k, v in info.items()))
    names = [s.name for s in servers(venv, args.port, base)]
    wanted = args.only.split(",") if args.only else names
    unknown = set(wanted) - set(names)
    if unknown:
        sys.exit(f"unknown server(s): {', '.join(sorted(unknown))}; choose from {', '.join(names)}")

    runs: dict[str, list[dict]] = {n: [] for n in wanted}
    failed: dict[str, str] = {}
    for rnd in range(args.rounds):
        order = [s for s in servers(venv, args.port + 20 * rnd, base) if s.name in wanted]
        if rnd % 2:  # alternate the order so no server always runs first
            order.reverse()
        for server in order:
            if server.name in failed:
                continue
            print(f"round {rnd + 1}/{args.rounds}: {server.name} ...", end=" ", flush=True)
            res = bench_one(server, args.duration)
            if "error" in res:
                failed[server.name] = res["error"]
                print(res["error"])
                continue
            runs[server.name].append(res)
            print(f"{res['rps']:.0f} req/s, p99 {fmt(res['p99_ms'], '.2f')} ms, errors {res['errors']}")

    summary: dict[str, dict] = {}
    for name in wanted:
        iface = next(s.interface for s in servers(venv, 0, base) if s.name == name)
        if name in failed:
            summary[name] = {"interface": iface, "error": failed[name]}
        else:
            summary[name] = {
                "interface": iface,
                "rps": median([r["rps"] for r in runs[name]]),
                "p99_ms": median([r["p99_ms"] for r in runs[name]]),
                "errors": sum(r["errors"] + r["non2xx"] for r in runs[name]),
            }

    def ratio(name: str) -> float | None:
        base = WSGI_BASELINE if summary[name]["interface"] == "wsgi" else ASGI_BASELINE
        mine, ref = summary[name].get("rps"), summary.get(base, {}).get("rps")
        return mine / ref if mine and ref else None

    print(f"\nmedian of {args.rounds} rounds, {args.duration:g}s each, wrk -t2 -c64 keep-alive, 2 workers, "
          f"Python {info.get('python')}")
    rows = []
    for name, s in summary.items():
        base = WSGI_BASELINE if s["interface"] == "wsgi" else ASGI_BASELINE
        if "error" in s:
            rows.append([name, s["interface"], "-", "-", "-", "-", s["error"]])
        else:
            rows.append([name, s["interface"], f"{s['rps']:.0f}", fmt(s["p99_ms"], ".2f"),
                         fmt(ratio(name), ".2f", "x") + f" vs {base}", str(s["errors"]), ""])
    print_table(["server", "iface", "req/s", "p99 ms", "ratio", "errors", "note"], rows)

    checks = {}
    print()
    for name, base, target in TARGETS:
        if name not in summary or base not in summary:
            continue
        r = ratio(name)
        ok = r is not None and r >= target
        checks[name] = {"baseline": base, "target": target, "ratio": r, "pass": ok}
        print(f"[{'PASS' if ok else 'FAIL'}] {name} >= {target:.1f}x {base}: {fmt(r, '.2f', 'x')}")

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
