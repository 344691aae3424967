"""Memory creep soak: worker RSS over requests served, glibc vs --malloc-trim vs jemalloc.

Three refork servers run the allocation-heavy app benchmarks/apps/churn_wsgi.py side by side for
the whole run, each with 4 workers x 4 threads (several threads: glibc gives each its own arena):

    glibc       refork -w 4 --threads 4 churn_wsgi:app
    glibc-trim  ... --malloc-trim
    jemalloc    ... --allocator jemalloc

Fairness on a 2-core machine: the servers are loaded one at a time, in rounds (the order rotates
every round), each for `--turn` seconds of wrk (a Lua script that mixes JSON uploads, reports and
blobs of varied sizes) per turn, until each has served `--requests` (the last turn is shortened
to about what is left, from the server's rate so far). Loading
them concurrently would make three servers and their load generators fight over two cores and
tie each variant's speed to the others'; in rounds, each gets the whole machine for its turn and
all three see the same machine conditions over the run. Between its turns a server idles (that
is when --malloc-trim trims; production servers idle too).

While a server is loaded, every `--interval` seconds (and right after each turn) the benchmark asks
its monitor for `refork status` over the control socket (refork's own /proc/PID/smaps_rollup
accounting, re-read on demand) and records each worker's requests, RSS, PSS and USS:

    python benchmarks/memory_creep.py                       # quick: 50k requests per variant
    python benchmarks/memory_creep.py --requests 1000000    # the recorded run (docs/benchmarks.md)
    python benchmarks/memory_creep.py --only jemalloc --jemalloc-conf notc=narenas:1,tcache:false \
        --requests 200000 --warmup 0.25 --plot ''          # compare MALLOC_CONFs (docs/benchmarks.md)

Writes benchmarks/results/memory-creep-STAMP.csv (every sample) and .json (summary), prints the
table for docs/benchmarks.md, and with matplotlib installed (benchmarks/setup.sh) draws
docs/memory-creep.png: mean worker RSS over requests served, per variant.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import BENCH_DIR, RESULTS_DIR, ROOT, Server, print_table, refork_cmd, venv_dir, versions

APPS = BENCH_DIR / "apps"
VARIANTS: dict[str, list[str]] = {
    "glibc": [],
    "glibc-trim": ["--malloc-trim"],
    "jemalloc": ["--allocator", "jemalloc"],
}
MIB = 1024 * 1024

# wrk: a fixed, varied request mix, built once per wrk thread from a seeded generator.
WRK_SCRIPT = r"""
local reqs = {}
local i = 0

local function tags(n)
  local t = {}
  for k = 1, n do t[k] = string.format('"t%d"', k) end
  return table.concat(t, ",")
end

local function ingest(items)
  local parts = {}
  for k = 1, items do
    parts[k] = string.format('{"name":"item-%d","count":%d,"note":"%s","tags":[%s]}',
      (k * 7919) % 1000, k, string.rep("x", (k * 37) % 300), tags(k % 6))
  end
  return '{"items":[' .. table.concat(parts, ",") .. ']}'
end

local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end

function init(args)
  local seed = tonumber(args[1]) or 1
  math.randomseed(seed * 100 + (id or 0))
  local json = {["Content-Type"] = "application/json"}
  for n = 1, 400 do
    local x = math.random()
    local r
    if x < 0.45 then
      local sizes = {3, 10, 30, 100, 250}
      r = wrk.format("POST", "/ingest", json, ingest(sizes[math.random(#sizes)]))
    elseif x < 0.80 then
      local rows = {5, 20, 60, 150}
      local n = rows[math.random(#rows)]
      if math.random() < 0.02 then n = 800 end  -- a large report now and then
      r = wrk.format("GET", "/report?rows=" .. n)
    else
      local kib = {2, 8, 32, 96}
      local n = kib[math.random(#kib)]
      if math.random() < 0.03 then n = 1024 end  -- a large blob now and then
      r = wrk.format("GET", "/blob?kb=" .. n)
    end
    reqs[n] = r
  end
end

function request()
  if math.random() < 0.0005 then
    -- a rare bulk export, heavy-tailed (Pareto, alpha 1): mostly 1-2 MiB, now and then tens
    local mb = math.min(64, 0.75 / (1 - math.random()))
    return wrk.format("GET", string.format("/export?mb=%.2f", mb))
  end
  i = i % #reqs + 1
  return reqs[i]
end
"""


def status(sock: str) -> dict:
    from refork.process.control import request  # the benchmark venv has refork installed

    return request(sock, "status", timeout=30.0)


class Sampler:
    """Polls one server's status every interval seconds while it is loaded; appends CSV rows."""

    def __init__(self, writer: csv.writer, interval: float) -> None:
        self.writer = writer
        self.interval = interval
        self.rows: list[dict] = []
        self.lock = threading.Lock()
        self.start = time.monotonic()

    def sample(self, variant: str, sock: str, round_nr: int) -> dict | None:
        try:
            answer = status(sock)
        except OSError as e:
            print(f"  {variant}: status failed: {e}", file=sys.stderr)
            return None
        workers = [p for p in answer.get("processes", []) if p["role"] == "worker"]
        served = sum(p["requests"] for p in workers)
        t = round(time.monotonic() - self.start, 2)
        with self.lock:
            for p in workers:
                row = {
                    "t": t,
                    "variant": variant,
                    "round": round_nr,
                    "served": served,
                    "worker": p["nr"],
                    "pid": p["pid"],
                    "requests": p["requests"],
                    "rss": p["rss"] or 0,
                    "pss": p["pss"] or 0,
                    "uss": p["uss"] or 0,
                }
                self.writer.writerow(row)
                self.rows.append(row)
        return {
            "served": served,
            "rss": [p["rss"] or 0 for p in workers],
            "pss": [p["pss"] or 0 for p in workers],
            "uss": [p["uss"] or 0 for p in workers],
            "allocator": answer.get("allocator"),
        }

    def during(self, variant: str, sock: str, round_nr: int, stop: threading.Event) -> None:
        while not stop.wait(self.interval):
            self.sample(variant, sock, round_nr)


def run_turn(port: int, seconds: float, connections: int, threads: int, script: Path, seed: int) -> dict:
    cmd = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{int(seconds)}s",
        "--timeout=30s",
        "-s",
        str(script),
        f"http://127.0.0.1:{port}/",
        "--",
        str(seed),
    ]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    elapsed = time.monotonic() - start
    errors = 0
    for line in out.splitlines():
        if "Socket errors" in line:
            errors = sum(int(x) for x in line.replace(",", " ").split() if x.isdigit())
        if "Non-2xx" in line:
            errors += int(line.split()[-1])
    return {"seconds": elapsed, "errors": errors}


def mean_mib(values: list[int]) -> float:
    return statistics.fmean(values) / MIB if values else 0.0


def per_sample(rows: list[dict], variant: str) -> list[dict]:
    """One point per status sample of a variant: requests served, mean and max worker RSS/PSS/USS."""
    by_sample: dict[tuple[float, int], list[dict]] = {}
    for r in rows:
        if r["variant"] == variant:
            by_sample.setdefault((r["t"], r["served"]), []).append(r)
    points = []
    for (_, served), workers in sorted(by_sample.items(), key=lambda kv: kv[0][1]):
        point: dict = {"served": served}
        for key in ("rss", "pss", "uss"):
            values = [w[key] for w in workers]
            point[key] = statistics.fmean(values) / MIB
            point[f"{key}_min"], point[f"{key}_max"] = min(values) / MIB, max(values) / MIB
        points.append(point)
    return points


def summarize(name: str, rows: list[dict], allocator: str, warmup: int, window: int, argv: list[str]) -> dict:
    """Worker RSS/PSS (mean over the workers) in two windows of `window` requests each: right after
    the warm-up, and at the end; the median over the samples in each window. Windows and medians,
    not single samples, because a sample can land in the middle of a large export (live memory,
    not creep); every sample is in the CSV and the plot."""
    points = per_sample(rows, name)
    served = points[-1]["served"]
    warm = [p for p in points if warmup <= p["served"] <= warmup + window] or [points[-1]]
    last = [p for p in points if p["served"] >= served - window]

    def mean(ps: list[dict], key: str) -> float:  # the median sample: robust to an export in flight
        return statistics.median(p[key] for p in ps)

    rss_w, rss_e = mean(warm, "rss"), mean(last, "rss")
    return {
        "variant": name,
        "allocator": allocator,
        "served": served,
        "warm_window": [warmup, warmup + window],
        "warm_samples": len(warm),
        "end_samples": len(last),
        "rss_warm_mib": rss_w,
        "rss_end_mib": rss_e,
        "growth_pct": (rss_e - rss_w) / rss_w * 100 if rss_w else 0.0,
        "rss_end_max_mib": max(p["rss_max"] for p in last),
        "rss_peak_mib": max(p["rss_max"] for p in points),
        "pss_warm_mib": mean(warm, "pss"),
        "pss_end_mib": mean(last, "pss"),
        "uss_end_mib": mean(last, "uss"),
        "command": " ".join(argv),
    }


def plot(rows: list[dict], summaries: list[dict], warmup: int, path: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed (run benchmarks/setup.sh): no plot", file=sys.stderr)
        return False
    colors = {"glibc": "tab:red", "glibc-trim": "tab:orange", "jemalloc": "tab:blue"}
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    for s in summaries:
        name = s["variant"]
        points = [(p["served"], p["rss"], p["rss_min"], p["rss_max"]) for p in per_sample(rows, name)]
        xs = [p[0] for p in points]
        color = colors.get(name)
        ax.fill_between(xs, [p[2] for p in points], [p[3] for p in points], color=color, alpha=0.15, lw=0)
        ax.plot(
            xs,
            [p[1] for p in points],
            color=color,
            lw=1.6,
            label=f"{name}: {s['rss_warm_mib']:.0f} -> {s['rss_end_mib']:.0f} MiB ({s['growth_pct']:+.1f}%)",
        )
    ax.axvline(warmup, color="grey", ls=":", lw=1)
    ax.text(warmup, ax.get_ylim()[0], " warm-up", color="grey", va="bottom", fontsize=8)
    ax.set_xlabel("requests served (per server, 4 workers)")
    ax.set_ylabel("worker RSS, MiB (mean line, min-max band)")
    ax.set_title(title, fontsize=10)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:.0f}k"))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--python", help="benchmark venv: a version like 3.11 or an interpreter (default: this one)"
    )
    ap.add_argument(
        "--requests", type=int, default=50_000, help="requests per variant (recorded run: 1000000)"
    )
    ap.add_argument("--turn", type=int, default=20, help="seconds of load per server per turn")
    ap.add_argument("--warmup", type=float, default=0.1, help="fraction of the requests that is warm-up")
    ap.add_argument(
        "--window", type=float, default=0.05, help="fraction of the requests averaged per reading"
    )
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=4, help="threads per worker")
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--wrk-threads", type=int, default=2)
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between samples")
    ap.add_argument("--only", help="comma-separated variants (default: all three)")
    ap.add_argument(
        "--jemalloc-conf",
        action="append",
        default=[],
        metavar="NAME=CONF",
        help="add a variant NAME: --allocator jemalloc with MALLOC_CONF=CONF (repeatable; to compare confs)",
    )
    ap.add_argument("--port", type=int, default=18700)
    ap.add_argument("--plot", default=str(ROOT / "docs" / "memory-creep.png"), help="PNG path ('' for none)")
    args = ap.parse_args()

    venv = venv_dir(args.python)
    confs = dict(c.split("=", 1) for c in args.jemalloc_conf)
    for name in confs:
        VARIANTS[name] = VARIANTS["jemalloc"]
    names = args.only.split(",") if args.only else [*VARIANTS]
    warmup = int(args.requests * args.warmup)
    info = versions(venv)
    print(
        f"python {info.get('python')}, refork {info.get('refork')}, {info.get('wrk')}, "
        f"{os.cpu_count()} cpus, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{len(names)} variants x {args.requests} requests, turns of {args.turn:g} s, warm-up {warmup}, "
        f"{args.workers} workers x {args.threads} threads, wrk -c{args.connections}"
    )

    tmp = Path(tempfile.mkdtemp(prefix="memory-creep-"))
    script = tmp / "mix.lua"
    script.write_text(WRK_SCRIPT)
    servers: dict[str, tuple[Server, str, list[str]]] = {}
    for k, name in enumerate(names):
        port = args.port + k
        sock = str(tmp / f"{name}.ctl")
        argv = [
            *refork_cmd(venv),
            "-w",
            str(args.workers),
            "--threads",
            str(args.threads),
            "--chdir",
            str(APPS),
            "-b",
            f"127.0.0.1:{port}",
            "--control-socket",
            sock,
            "--name",
            f"creep-{name}",
            *VARIANTS[name],
            "churn_wsgi:app",
        ]
        shown = ["refork", *argv[len(refork_cmd(venv)) :]]
        shown = [a for a in shown if not a.startswith(str(tmp)) and a != "--control-socket"]
        shown = [str(APPS.relative_to(ROOT)) if a == str(APPS) else a for a in shown]
        env = {"MALLOC_CONF": confs[name]} if name in confs else {}
        if env:
            shown = [f"MALLOC_CONF={confs[name]}", *shown]
        servers[name] = (Server(name, "wsgi", argv, port, ROOT, env=env), sock, shown)

    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    csv_path = RESULTS_DIR / f"memory-creep-{stamp}.csv"
    checkpoints: dict[str, list[dict]] = {n: [] for n in names}
    turns: dict[str, list[dict]] = {n: [] for n in names}
    try:
        for name, (server, _, _) in servers.items():
            err = server.start(path="/stats")
            if err:
                sys.exit(f"{name}: {err}")
        with csv_path.open("w", newline="") as f:
            fields = ["t", "variant", "round", "served", "worker", "pid", "requests", "rss", "pss", "uss"]
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            sampler = Sampler(writer, args.interval)
            for name, (_, sock, _) in servers.items():
                checkpoints[name].append(sampler.sample(name, sock, 0))
            round_nr = 0
            while any(checkpoints[n][-1]["served"] < args.requests for n in names):
                round_nr += 1
                order = names[round_nr % len(names) :] + names[: round_nr % len(names)]
                for name in order:
                    server, sock, _ = servers[name]
                    left = args.requests - checkpoints[name][-1]["served"]
                    if left <= 0:
                        continue
                    stop = threading.Event()
                    poller = threading.Thread(
                        target=sampler.during, args=(name, sock, round_nr, stop), daemon=True
                    )
                    poller.start()
                    done = turns[name]
                    rate = sum(t["requests"] for t in done) / sum(t["seconds"] for t in done) if done else 0
                    seconds = min(args.turn, max(1, math.ceil(left / rate))) if rate else args.turn
                    turn = run_turn(
                        server.port, seconds, args.connections, args.wrk_threads, script, round_nr
                    )
                    stop.set()
                    poller.join()
                    cp = sampler.sample(name, sock, round_nr)
                    if cp is None or server.proc is None or server.proc.poll() is not None:
                        sys.exit(f"{name}: server went away: {server.first_stderr_line()}")
                    checkpoints[name].append(cp)
                    turn["requests"] = cp["served"] - checkpoints[name][-2]["served"]
                    turns[name].append(turn)
                    f.flush()
                    print(
                        f"  round {round_nr:3d} {name:11s} served {cp['served']:8d}  "
                        f"{turn['requests'] / turn['seconds']:6.0f} req/s  errors {turn['errors']}  "
                        f"RSS mean {mean_mib(cp['rss']):6.1f} MiB  PSS mean {mean_mib(cp['pss']):6.1f} MiB",
                        flush=True,
                    )
    finally:
        for server, _, _ in servers.values():
            server.stop()

    window = int(args.requests * args.window)
    summaries = [
        summarize(n, sampler.rows, checkpoints[n][-1]["allocator"], warmup, window, servers[n][2])
        for n in names
    ]
    for s in summaries:
        rates = [t["requests"] / t["seconds"] for t in turns[s["variant"]] if t["seconds"] > 0]
        s["rps_median"] = statistics.median(rates) if rates else 0.0
        s["errors"] = sum(t["errors"] for t in turns[s["variant"]])
    print()
    headers = [
        "variant",
        "allocator",
        "served",
        f"RSS after warm-up ({warmup // 1000}k)",
        "RSS at end",
        "growth",
        "PSS at end",
        "req/s (median turn)",
        "errors",
    ]
    print_table(
        headers,
        [
            [
                s["variant"],
                s["allocator"],
                str(s["served"]),
                f"{s['rss_warm_mib']:.1f} MiB",
                f"{s['rss_end_mib']:.1f} MiB",
                f"{s['growth_pct']:+.1f}%",
                f"{s['pss_end_mib']:.1f} MiB",
                f"{s['rps_median']:.0f}",
                str(s["errors"]),
            ]
            for s in summaries
        ],
    )
    for s in summaries:
        print(f"  {s['variant']}: {s['command']}")
    summary_path = csv_path.with_suffix(".json")
    import json

    summary_path.write_text(
        json.dumps(
            {
                "versions": info,
                "requests": args.requests,
                "turn_seconds": args.turn,
                "warmup": warmup,
                "window": args.window,
                "workers": args.workers,
                "threads": args.threads,
                "connections": args.connections,
                "summaries": summaries,
                "turns": turns,
                "samples_csv": csv_path.name,
            },
            indent=2,
        )
    )
    print(f"samples: {csv_path}\nsummary: {summary_path}")
    if args.plot:
        title = (
            f"refork, {args.workers} workers x {args.threads} threads, churn_wsgi.py, "
            f"{args.requests:,} requests per allocator (Python {info.get('python')})"
        )
        if plot(sampler.rows, summaries, warmup, Path(args.plot), title):
            print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
