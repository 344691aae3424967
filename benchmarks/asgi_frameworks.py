"""ASGI: a hello world, a FastAPI JSON endpoint and a Starlette streaming response, refork against
uvicorn and granian, with CPU per request, p50 and p99.

Every server runs 2 workers on 127.0.0.1 (`benchmarks/apps/hello_asgi.py`,
`benchmarks/apps/frameworks_asgi.py`). For each app and
server, in each round: start, wait for a 200, warm up 2 s, then `wrk -t2 -c64 -d<D>s --latency`;
the servers' CPU (user + system of every process, threads included) over the measured run divided
by its requests is the CPU per request, printed whole and split into user (the server's own code
and the app) and system (the kernel: TCP over loopback, epoll). Servers interleave within each
round, the order alternates, medians over rounds; the ratio is against uvicorn.

    python benchmarks/asgi_frameworks.py [--python 3.11] [--duration 5] [--rounds 3] [--only refork,uvicorn]

refork is run from the checkout this script is in, the peers from benchmarks/.venv-X.Y
(benchmarks/setup.sh installs FastAPI).
"""

from __future__ import annotations

import time
from pathlib import Path

from common import (
    BENCH_DIR,
    ROOT,
    Server,
    announce,
    bench_parser,
    chosen,
    cpu_delta,
    cpu_seconds,
    finish,
    fmt,
    median,
    print_table,
    rps_ratio,
    run_rounds,
    run_wrk,
    summarize,
    write_results,
)

APPS = BENCH_DIR / "apps"
CASES = {"hello": ("hello_asgi:app", "/"),
         "fastapi-json": ("frameworks_asgi:fastapi_app", "/items/42?q=hello"),
         "starlette-stream": ("frameworks_asgi:starlette_app", "/stream")}  # fmt: skip


def servers(venv: Path, port: int, app: str) -> list[Server]:
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    specs = [
        ("refork", [str(bin_ / "python"), "-m", "refork", "-w", "2", "--chdir", str(APPS),
                    "-b", f"{bind}:{port}", "--interface", "asgi", app]),
        ("uvicorn", [str(bin_ / "uvicorn"), "--workers", "2", "--http", "httptools", "--loop", "uvloop",
                     "--no-access-log", "--log-level", "warning", "--host", bind, "--port", str(port + 1),
                     app]),
        ("granian", [str(bin_ / "granian"), "--workers", "2", "--host", bind, "--port", str(port + 2),
                     "--no-ws", "--log-level", "warning", "--interface", "asgi", app]),
    ]  # fmt: skip
    mine = {"PYTHONPATH": str(ROOT)}  # refork from this checkout
    return [Server(name, "asgi", argv, port + i, APPS, env=mine if name == "refork" else {})
            for i, (name, argv) in enumerate(specs)]  # fmt: skip


def bench_one(server: Server, duration: float, path: str) -> dict:
    error = server.start(path=path)
    if error:
        server.stop()
        return {"error": error}
    run_wrk(server.port, 2, path=path)
    before = cpu_seconds(server.pids())
    result = run_wrk(server.port, duration, path=path)
    user, system = cpu_delta(before, cpu_seconds(server.pids()))
    count = result["requests"]
    result["cpu_us"] = (user + system) / count * 1e6 if count else None
    result["user_us"] = user / count * 1e6 if count else None  # the servers' own code
    result["sys_us"] = system / count * 1e6 if count else None  # the kernel's part: TCP, epoll
    return finish(server, result)


def line(res: dict) -> str:
    return (f"{res['rps']:.0f} req/s, p50 {fmt(res['p50_ms'], '.2f')} ms, "
            f"p99 {fmt(res['p99_ms'], '.2f')} ms, CPU {fmt(res['cpu_us'], '.1f')} us/request "
            f"({fmt(res['user_us'], '.1f')} user), "
            f"errors {res['errors'] + res['non2xx']}")  # fmt: skip


def main() -> None:
    args = bench_parser(__doc__, duration=5.0, port=19700).parse_args()
    venv, info = announce(args.python)
    wanted = chosen(["refork", "uvicorn", "granian"], args.only)
    results: dict = {}
    for case, (app, path) in CASES.items():
        runs, failed = run_rounds(
            args.rounds,
            lambda rnd, app=app: servers(venv, args.port + 10 * rnd, app),
            wanted,
            lambda server, path=path: bench_one(server, args.duration, path),
            line,
            label=f"{case}: ",
        )

        def medians(rs: list[dict]) -> dict:
            keys = ("rps", "p50_ms", "p99_ms", "cpu_us", "user_us", "sys_us")
            out = {key: median([r[key] for r in rs if r[key] is not None]) for key in keys}
            return out | {"errors": sum(r["errors"] + r["non2xx"] for r in rs)}

        results[case] = {"summary": summarize(wanted, runs, failed, medians), "runs": runs}
    print(f"\nASGI frameworks, median of {args.rounds} rounds, {args.duration:g}s each, wrk -t2 -c64, "
          f"2 workers, Python {info.get('python')}")  # fmt: skip
    rows = []
    for case, res in results.items():
        summary = res["summary"]
        for name, s in summary.items():
            if "error" in s:
                rows.append([case, name, "-", "-", "-", "-", "-", "-", "-", s["error"]])
                continue
            rows.append([case, name, f"{s['rps']:.0f}", fmt(s["p50_ms"], ".2f"), fmt(s["p99_ms"], ".2f"),
                         fmt(s["cpu_us"], ".1f"), fmt(s["user_us"], ".1f"), fmt(s["sys_us"], ".1f"),
                         fmt(rps_ratio(summary, name, "uvicorn"), ".2f", "x"), str(s["errors"])])  # fmt: skip
    columns = ["case", "server", "req/s", "p50 ms", "p99 ms", "CPU us/req", "user", "sys", "vs uvicorn",
               "errors"]
    print_table(columns, rows)
    path = write_results("asgi_frameworks", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "duration": args.duration,
        "rounds": args.rounds, "results": results,
    })  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
