"""How long a killed worker takes to be replaced: standing mold vs --mold-idle-exit.

Serves the generated monolith with refork, 4 workers; warms it; waits until the tree is stable
(with --mold-idle-exit: until the mold was let go); SIGKILLs one worker and polls the control
socket until its replacement reports ready. Repeats --rounds times per configuration, alternating.

    python benchmarks/cow/replacement.py --python 3.12 [--rounds 3]
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import (  # noqa: E402
    BENCH_DIR,
    ROOT,
    Server,
    announce,
    fmt,
    median,
    print_table,
    refork_cmd,
    script_parser,
    send_requests,
    write_results,
)

sys.path.insert(0, str(ROOT))
from refork.process.control import request  # noqa: E402  (stdlib only)

APP = "monolith_generated.app:app"
CONFIGS = {"standing mold": [], "--mold-idle-exit 1": ["--mold-idle-exit", "1"]}


def ready_workers(control: str) -> set[int]:
    status = request(control, "status")
    return {p["pid"] for p in status["processes"] if p["role"] == "worker" and p["state"] == "ready"}


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.005)
    raise TimeoutError(what)


def one_round(venv: Path, name: str, port: int, workers: int, control: str) -> float | str:
    argv = [*refork_cmd(venv), "-w", str(workers), "--chdir", str(BENCH_DIR), "-b", f"127.0.0.1:{port}",
            "--control-socket", control, *CONFIGS[name], APP]
    server = Server(name, "wsgi", argv, port, BENCH_DIR)
    error = server.start(timeout=180.0, path="/mem")
    if error:
        server.stop()
        return error
    try:
        wait_for(lambda: len(ready_workers(control)) == workers, 60, "all workers ready")
        send_requests(port, [f"/r/{i}" for i in range(300)], 100 * workers, 2 * workers, keepalive=False)
        shed = bool(CONFIGS[name])
        wait_for(lambda: request(control, "status")["mold_shed"] == shed, 60, "the mold's state")
        before = ready_workers(control)
        victim = min(before)
        start = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: len(w := ready_workers(control)) == workers and victim not in w, 60, "a replacement")
        return (time.monotonic() - start) * 1000
    except TimeoutError as e:
        return f"timed out waiting for {e}"
    finally:
        server.stop()


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=19600)
    args = parser.parse_args()
    if not (BENCH_DIR / "monolith_generated" / "app.py").exists():
        sys.exit("benchmarks/monolith_generated is missing: run benchmarks/cow/make_monolith.py first")
    venv, info = announce(args.python)

    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    errors: dict[str, list[str]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="bench-ctl-") as tmp:
        for r in range(args.rounds):
            for i, name in enumerate(CONFIGS if r % 2 == 0 else reversed(CONFIGS)):
                result = one_round(venv, name, args.port + i, args.workers, f"{tmp}/{r}-{i}.ctl")
                shown = f"{result:.0f} ms" if isinstance(result, float) else result
                print(f"round {r + 1}: {name}: {shown}", flush=True)
                (times if isinstance(result, float) else errors)[name].append(result)

    base = median(times["standing mold"])
    rows = [[name, fmt(median(t), ".0f"), ", ".join(f"{x:.0f}" for x in t),
             fmt(median(t) / base if t and base else None, ".1f", "x"), "; ".join(errors[name])]
            for name, t in times.items()]
    print(f"\nkilled worker -> replacement ready, {args.workers} workers, Python {info.get('python')}")
    print_table(["configuration", "median ms", "rounds ms", "vs standing mold", "errors"], rows)
    path = write_results(f"replacement-py{info.get('python')}", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "times_ms": times, "errors": errors,
    })
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
