"""WebSocket echo: refork vs uvicorn (--ws websockets, wsproto, websockets-sansio) and granian.

Every server runs the same plain ASGI echo app (benchmarks/apps/echo_asgi.py) with 2 workers on
127.0.0.1, default settings otherwise. The load comes from benchmarks/wsload, a Rust client (tokio +
tokio-tungstenite, one thread) built by benchmarks/setup.sh, so the client costs a fraction of the
server's CPU (printed).

Case A, echo: 32 clients, each sends a 32-byte text message and waits for its echo, in a loop:
messages per second, round-trip p50/p99, and the server's CPU time per message. In each round every
server is started (fresh) and warmed up, then each gets --bursts bursts of --duration seconds,
interleaved (the order reverses every burst), so that a busy minute of a shared machine falls on all
of them; refork's ratio to a peer is the median over bursts of the ratio between bursts of the same
slot.

Case B, idle: after a warm-up (64 clients echoing for 1 s) and with the server's memory settled,
the PSS and RSS of the server's whole process tree (/proc/PID/smaps_rollup of the monitor, mold and
workers; uvicorn's and granian's parent and workers) with 0 WebSockets open; then 1,000 connections
are opened and held idle (one client ping per connection every 5 s), the memory settles and is read
again: (open - 0) / connections open = memory per open connection.

Case C, libs: the per-message cost of wsproto and websockets alone (parse one masked frame, build
the echo; no sockets), which explains most of the CPU-per-message differences in case A.

Servers are interleaved within each round (a fresh start per case), the order reverses every other
round, and medians are reported with refork's ratio to each peer.

    python3 benchmarks/websocket.py [--python 3.11] [--rounds 3] [--bursts 5] [--duration 3]
                                    [--connections 1000] [--only refork,uvicorn-websockets]
                                    [--cases echo,idle,libs] [--refork-path CHECKOUT]

The peers run from benchmarks/.venv-X.Y (benchmarks/setup.sh); refork from this checkout's own
.venv-3.11 (--refork-python to change it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from common import (
    BENCH_DIR,
    ROOT,
    Server,
    bench_parser,
    chosen,
    cpu_by_pid,
    cpu_seconds,
    finish,
    fmt,
    median,
    print_table,
    print_versions,
    round_order,
    rss_kib,
    run_rounds,
    smaps_rollup,
    summarize,
    venv_dir,
    versions,
    wait_stable,
    write_results,
)

APPS = BENCH_DIR / "apps"
WSLOAD = BENCH_DIR / "wsload" / "target" / "release" / "wsload"
PEERS = ("uvicorn-websockets", "uvicorn-wsproto", "uvicorn-sansio", "granian")


def servers(venv: Path, refork_python: Path, port: int, refork_path: Path | None = None) -> list[Server]:
    """All contenders, in run order, on ports port, port+1, ..."""
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    refork = [str(refork_python), "-m", "refork", "-w", "2", "--chdir", str(APPS), "-b", f"{bind}:{{port}}",
              "--interface", "asgi"]  # fmt: skip
    uvicorn = [str(bin_ / "uvicorn"), "--workers", "2", "--http", "httptools", "--loop", "uvloop",
               "--no-access-log", "--log-level", "warning", "--host", bind, "--port", "{port}"]  # fmt: skip
    granian = [str(bin_ / "granian"), "--interface", "asgi", "--workers", "2", "--host", bind,
               "--port", "{port}", "--log-level", "warning"]  # fmt: skip
    specs = [
        ("refork", [*refork, "echo_asgi:app"]),
        ("uvicorn-websockets", [*uvicorn, "--ws", "websockets", "echo_asgi:app"]),
        ("uvicorn-wsproto", [*uvicorn, "--ws", "wsproto", "echo_asgi:app"]),
        # uvicorn's default since websockets 14 (`--ws auto`): the websockets library's sans-IO core.
        ("uvicorn-sansio", [*uvicorn, "--ws", "websockets-sansio", "echo_asgi:app"]),
        ("granian", [*granian, "echo_asgi:app"]),
    ]
    mine = {"PYTHONPATH": str(refork_path)} if refork_path else {}
    return [
        Server(name, "asgi", [a.replace("{port}", str(port + i)) for a in argv], port + i, APPS,
               env=mine if name == "refork" else {})  # fmt: skip
        for i, (name, argv) in enumerate(specs)
    ]


# --------------------------------------------------------------------------- measurements


def tree_memory(pids: list[int]) -> dict[str, int]:
    """Summed PSS and RSS (KiB) over the process tree, from smaps_rollup."""
    pss = rss = 0
    for pid in pids:
        try:
            fields = smaps_rollup(pid)
        except OSError:
            continue
        pss += fields.get("Pss", 0)
        rss += fields.get("Rss", 0)
    return {"pss_kib": pss, "rss_kib": rss, "processes": len(pids)}


def wsload(mode: str, port: int, *args: str) -> list[str]:
    return [str(WSLOAD), mode, "--url", f"ws://127.0.0.1:{port}/", *args]


def start(server: Server) -> str | None:
    error = server.start()
    if error:
        server.stop()
        return error
    wait_stable(server, min_procs=3, quiet=2.0, timeout=60.0)
    return None


def echo_burst(server: Server, duration: float, clients: int, warmup: float = 0.5) -> dict:
    """One echo burst against a running server: msg/s, RTT, and the server's and the client's CPU."""
    pids = server.pids()
    setup = 0.5  # wsload connects its clients, then warms up, then measures `duration` seconds
    argv = wsload("echo", server.port, "--clients", str(clients), "--duration", f"{duration:g}",
                  "--setup", f"{setup:g}", "--warmup", f"{warmup:g}")  # fmt: skip
    client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Read the server's CPU over wsload's measured window.
    t0 = time.monotonic()
    time.sleep(setup + warmup)
    cpu0 = cpu_seconds(pids)
    time.sleep(max(0.0, t0 + setup + warmup + duration - time.monotonic()))
    cpu1 = cpu_seconds(pids)
    try:
        out, err = client.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        client.kill()
        out, err = client.communicate()
    try:
        result = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"wsload failed: {err.strip()[-300:] or out[-300:]}"}
    if not result["messages"]:
        return {"error": f"no echo: {result.get('first_error')}"}
    by_pid = cpu_by_pid(cpu0, cpu1)
    result["server_cpu_by_pid_s"] = by_pid
    result["server_cpu_pct"] = 100 * sum(by_pid.values()) / duration
    # CPU per echoed message: what a message costs the server, less sensitive to a loaded machine
    # than msg/s (a server starved of CPU does the same work per message, only later).
    result["server_cpu_us_per_msg"] = 1e6 * sum(by_pid.values()) / result["messages"]
    # the busiest process's share: 50% = the load is even over 2 workers, 100% = all on one
    result["busiest_share_pct"] = 100 * max(by_pid.values()) / (sum(by_pid.values()) or 1)
    result["client_cpu_pct"] = 100 * (result["cpu_user_s"] + result["cpu_sys_s"]) / duration
    result["server_processes"] = len(pids)
    return result


def echo_round(everyone: list[Server], rnd: int, args: argparse.Namespace, runs: dict, failed: dict) -> None:
    """Case A, one round: start every server (fresh), warm each up, then --bursts short echo bursts
    per server, interleaved (the order reverses every burst), so that the machine's noise falls on
    every server alike; stop them all."""
    live = []
    for server in everyone:
        if server.name not in failed:
            if error := start(server):
                failed[server.name] = error
                print(f"echo round {rnd + 1}: {server.name}: {error}")
            else:
                live.append(server)
    try:
        for server in live:  # warm-up: every worker has served WebSockets before the first burst
            warm = wsload("echo", server.port, "--clients", str(args.clients), "--duration", "1",
                          "--setup", "0.3", "--warmup", "0")  # fmt: skip
            subprocess.run(warm, capture_output=True, timeout=60)
        for burst in range(args.bursts):
            order = live[::-1] if (rnd * args.bursts + burst) % 2 else live
            for server in order:
                if server.name in failed:
                    continue
                tag = f"echo round {rnd + 1}/{args.rounds} burst {burst + 1}/{args.bursts}: {server.name}"
                print(f"{tag} ...", end=" ", flush=True)
                res = echo_burst(server, args.duration, args.clients)
                if "error" in res:
                    failed[server.name] = res["error"]
                    print(res["error"])
                    continue
                res["round"], res["burst"] = rnd, burst
                runs[server.name].append(res)
                print(echo_line(res))
    finally:
        for server in live:
            leaked = server.stop()
            if leaked:
                failed.setdefault(server.name, f"left processes behind: {leaked}")


def bench_idle(server: Server, connections: int, ping_interval: float) -> dict:
    """Case B: the server tree's memory with 0 and with `connections` idle WebSockets open."""
    if error := start(server):
        return {"error": error}
    # Warm-up: every worker has served WebSockets (lazy imports, first buffers) before the baseline.
    subprocess.run(wsload("echo", server.port, "--clients", "64", "--duration", "1", "--warmup", "0"),
                   capture_output=True, text=True, timeout=60)  # fmt: skip
    wait_stable(server, min_procs=3, quiet=3.0, timeout=60.0)
    base = tree_memory(server.pids())
    client = subprocess.Popen(
        wsload("idle", server.port, "--connections", str(connections), "--concurrency", "50",
               "--ping-interval", f"{ping_interval:g}", "--hold", "180"),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert client.stdout is not None and client.stdin is not None
        line = client.stdout.readline()
        try:
            opened = json.loads(line)
        except json.JSONDecodeError:
            client.kill()
            return finish(
                server, {"error": f"wsload idle failed: {line.strip() or client.stderr.read()[-300:]}"}
            )
        wait_stable(server, min_procs=3, quiet=3.0, timeout=60.0)
        held = tree_memory(server.pids())
        per_worker = {pid: rss_kib(pid) for pid in server.pids()}
        client.stdin.write("\n")
        client.stdin.flush()
        out, _ = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    try:
        summary = json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        summary = {}
    n = opened.get("connections", 0)
    if not n:
        return finish(server, {"error": f"no connection opened: {opened.get('first_error')}"})
    result = {
        "open": n,
        "failed": opened.get("failed"),
        "connect_s": opened.get("connect_s"),
        "first_error": opened.get("first_error"),
        "dropped": summary.get("dropped"),
        "closed_clean": summary.get("closed_clean"),
        "base": base,
        "held": held,
        "rss_by_pid_kib": per_worker,
        "pss_per_conn_kib": (held["pss_kib"] - base["pss_kib"]) / n if n else None,
        "rss_per_conn_kib": (held["rss_kib"] - base["rss_kib"]) / n if n else None,
    }
    return finish(server, result)


# --------------------------------------------------------------------------- C. the libraries alone

# Run by the benchmark venv's python: the per-message cost of the two sans-IO protocol libraries the
# servers build on, without sockets or event loop: take one masked 32-byte client text frame, parse
# it, build the echo frame. wsproto (refork, uvicorn --ws wsproto) is pure Python; websockets
# (uvicorn --ws websockets-sansio) parses with generators and unmasks in its C speedups module.
LIBS_CODE = """
import json, timeit
import websockets, wsproto
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import TextMessage

frame = Frame(Opcode.TEXT, b"client 0001 says hello xxxxxxxxx").serialize(mask=True, extensions=[])
w = Connection(ConnectionType.SERVER)
p = Protocol(Side.SERVER, state=State.OPEN)  # uvicorn's ServerProtocol after the handshake

def wsproto_echo():
    w.receive_data(frame)
    out = b""
    for event in w.events():
        out = w.send(TextMessage(data=event.data))
    return out

def websockets_echo():
    p.receive_data(frame)
    for event in p.events_received():
        p.send_text(event.data)
    return p.data_to_send()

out = {}
for name, fn in (("wsproto " + wsproto.__version__, wsproto_echo),
                 ("websockets " + websockets.__version__, websockets_echo)):
    assert fn(), name
    out[name] = min(timeit.repeat(fn, number=20000, repeat=7)) / 20000 * 1e6
print(json.dumps(out))
"""


def bench_libs(venv: Path) -> dict:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", LIBS_CODE], capture_output=True, text=True)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    us = json.loads(out.stdout)
    print("\nC. the protocol libraries alone: parse one masked 32-byte text frame + build the echo, "
          "best of 7 x 20,000")  # fmt: skip
    for name, value in us.items():
        print(f"  {name}: {value:.2f} us per message")
    return us


# --------------------------------------------------------------------------- main


def echo_line(r: dict) -> str:
    rtt = f"p50 {r['p50_us'] / 1000:.2f} ms, p99 {r['p99_us'] / 1000:.2f} ms"
    cpu = (f"server CPU {r['server_cpu_pct']:.0f}% (busiest process {r['busiest_share_pct']:.0f}% of it), "
           f"client CPU {r['client_cpu_pct']:.0f}%")  # fmt: skip
    per = f"{r['server_cpu_us_per_msg']:.1f} CPU us/msg"
    return f"{r['mps']:.0f} msg/s, {rtt}, errors {r['errors']}, {cpu}, {per}"


def idle_line(r: dict) -> str:
    per = f"PSS {r['pss_per_conn_kib']:.1f} KiB/conn, RSS {r['rss_per_conn_kib']:.1f} KiB/conn"
    mib = f"tree PSS {r['base']['pss_kib'] / 1024:.1f} -> {r['held']['pss_kib'] / 1024:.1f} MiB"
    return f"{r['open']} open ({r['failed']} failed, {r['dropped']} dropped), {per}, {mib}"


def run_case(case: str, args: argparse.Namespace, venv: Path, wanted: list[str], port: int) -> dict:
    """Case A (echo: bursts interleaved within a round) or B (idle: one measurement a server a round)."""

    def lineup(rnd: int) -> list[Server]:
        return servers(venv, args.refork_python, port + 10 * rnd, args.refork_path)

    if case == "echo":
        runs: dict[str, list[dict]] = {n: [] for n in wanted}
        failed: dict[str, str] = {}
        for rnd in range(args.rounds):
            echo_round(round_order(lineup(rnd), wanted, rnd), rnd, args, runs, failed)
    else:
        def measure(server: Server) -> dict:
            return bench_idle(server, args.connections, args.ping_interval)

        runs, failed = run_rounds(args.rounds, lineup, wanted, measure, idle_line, label=f"{case} ")
    return {"runs": runs, "failed": failed}


def ratio_cells(summary: dict, key: str, names: list[str], higher_is_better: bool) -> list[str]:
    """refork's ratio to each peer (how many times better: >1 means refork is ahead)."""
    mine = summary.get("refork", {}).get(key)
    cells = []
    for peer in names:
        theirs = summary.get(peer, {}).get(key)
        if not mine or not theirs:
            cells.append("-")
        else:
            cells.append(f"{(mine / theirs if higher_is_better else theirs / mine):.2f}x")
    return cells


def paired_ratio(runs: dict, name: str, key: str, higher_is_better: bool) -> float | None:
    """Median over bursts of refork's ratio to `name` in the same burst slot (round, burst): the
    two ran seconds apart, so a slow minute of the machine hits both."""
    mine, theirs = runs.get("refork", []), runs.get(name, [])
    slots = {(r["round"], r["burst"]): r[key] for r in theirs}
    ratios = [
        (r[key] / slots[slot] if higher_is_better else slots[slot] / r[key])
        for r in mine
        if (slot := (r["round"], r["burst"])) in slots and r[key] and slots[slot]
    ]
    return median(ratios)


def report_echo(data: dict, args: argparse.Namespace, wanted: list[str]) -> dict:
    runs = data["runs"]

    def medians(rs: list[dict]) -> dict:
        per_round = [median([r["mps"] for r in rs if r["round"] == rnd]) for rnd in range(args.rounds)]
        return {
            "mps": median([r["mps"] for r in rs]),
            "mps_rounds": [round(x) for x in per_round if x is not None],
            "p50_ms": median([r["p50_us"] / 1000 for r in rs]),
            "p99_ms": median([r["p99_us"] / 1000 for r in rs]),
            "errors": sum(r["errors"] + r["mismatches"] for r in rs),
            "server_cpu_pct": median([r["server_cpu_pct"] for r in rs]),
            "cpu_us_per_msg": median([r["server_cpu_us_per_msg"] for r in rs]),
            "client_cpu_pct": median([r["client_cpu_pct"] for r in rs]),
            "bursts": len(rs),
            # bursts in which one process did over 90% of the server's work (all clients on one worker)
            "one_worker_bursts": sum(1 for r in rs if r["busiest_share_pct"] > 90),
        }

    summary = summarize(wanted, runs, data["failed"], medians)
    for name, s in summary.items():
        if "error" not in s and name != "refork" and "refork" in runs:
            s["paired_mps_ratio"] = paired_ratio(runs, name, "mps", True)
            s["paired_cpu_ratio"] = paired_ratio(runs, name, "server_cpu_us_per_msg", False)
    print(f"\nA. echo: {args.clients} clients, 32-byte text messages, 2 workers; median of {args.rounds} "
          f"rounds x {args.bursts} interleaved bursts of {args.duration:g}s")  # fmt: skip
    rows = []
    for name, s in summary.items():
        if "error" in s:
            rows.append([name, *["-"] * 11, s["error"]])
            continue
        mine = name == "refork"
        ratio = "-" if mine else fmt(s.get("paired_mps_ratio"), ".2f", "x")
        cpu_ratio = "-" if mine else fmt(s.get("paired_cpu_ratio"), ".2f", "x")
        rounds = ", ".join(str(x) for x in s["mps_rounds"])
        rows.append([name, f"{s['mps']:.0f}", rounds, fmt(s["p50_ms"], ".2f"), fmt(s["p99_ms"], ".2f"),
                     str(s["errors"]), f"{s['server_cpu_pct']:.0f}%", f"{s['client_cpu_pct']:.0f}%",
                     f"{s['cpu_us_per_msg']:.1f}", f"{s['one_worker_bursts']}/{s['bursts']}", ratio,
                     cpu_ratio, ""])  # fmt: skip
    print_table(["server", "msg/s", "per round", "p50 ms", "p99 ms", "errors", "server CPU", "client CPU",
                 "CPU us/msg", "1-worker bursts", "refork msg/s / this", "this CPU/msg / refork", "note"],
                rows)  # fmt: skip
    print("(ratios: the median over bursts of refork's burst against this server's burst of the same slot)")
    return summary


def report_idle(data: dict, args: argparse.Namespace, wanted: list[str]) -> dict:
    def medians(rs: list[dict]) -> dict:
        return {
            "pss_per_conn_kib": median([r["pss_per_conn_kib"] for r in rs]),
            "pss_rounds": [round(r["pss_per_conn_kib"], 1) for r in rs if r["pss_per_conn_kib"] is not None],
            "rss_per_conn_kib": median([r["rss_per_conn_kib"] for r in rs]),
            "base_pss_mib": median([r["base"]["pss_kib"] / 1024 for r in rs]),
            "held_pss_mib": median([r["held"]["pss_kib"] / 1024 for r in rs]),
            "open": min(r["open"] for r in rs),
            "failed": sum(r["failed"] or 0 for r in rs),
            "dropped": sum(r["dropped"] or 0 for r in rs),
        }

    summary = summarize(wanted, data["runs"], data["failed"], medians)
    print(f"\nB. idle: {args.connections} open WebSockets (ping every {args.ping_interval:g}s), memory of "
          f"the server's process tree, median of {args.rounds} rounds, 2 workers")  # fmt: skip
    rows = []
    for name, s in summary.items():
        if "error" in s:
            rows.append([name, "-", "-", "-", "-", "-", "-", s["error"]])
            continue
        ratio = ratio_cells(summary, "pss_per_conn_kib", [name], False)[0] if name != "refork" else "-"
        rows.append([name, fmt(s["pss_per_conn_kib"], ".1f"), ", ".join(str(x) for x in s["pss_rounds"]),
                     fmt(s["rss_per_conn_kib"], ".1f"), f"{s['base_pss_mib']:.1f} -> {s['held_pss_mib']:.1f}",
                     str(s["open"]), f"{s['failed']}/{s['dropped']}", ratio])  # fmt: skip
    print_table(["server", "PSS KiB/conn", "rounds", "RSS KiB/conn", "tree PSS MiB", "open", "failed/dropped",
                 "refork / this"], rows)  # fmt: skip
    print("(refork / this: the peer's KiB per connection over refork's; > 1 means refork uses less)")
    return summary


def main() -> None:
    parser = bench_parser(
        __doc__, duration=3.0, port=19600, duration_help="measured seconds of one echo burst"
    )
    parser.add_argument(
        "--refork-python",
        type=Path,
        default=ROOT / ".venv-3.11" / "bin" / "python",
        help="the interpreter that runs refork (default: this checkout's .venv-3.11)",
    )
    parser.add_argument("--refork-path", type=Path,
                        help="run refork from this checkout (PYTHONPATH), not the installed one")  # fmt: skip
    parser.add_argument("--bursts", type=int, default=5, help="echo bursts per server per round")
    parser.add_argument("--clients", type=int, default=32, help="echo clients (case A)")
    parser.add_argument("--connections", type=int, default=1000, help="idle connections (case B)")
    parser.add_argument("--ping-interval", type=float, default=5.0, help="client ping per idle connection")
    parser.add_argument("--cases", default="echo,idle,libs", help="any of echo, idle, libs")
    args = parser.parse_args()

    if not WSLOAD.exists():
        sys.exit(f"{WSLOAD} is missing: run benchmarks/setup.sh (cargo build --release in benchmarks/wsload)")
    # 1,000 connections are 1,000 fds in a worker (and in the client): raise the soft limit, inherited.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 4 * args.connections + 256))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))

    venv = venv_dir(args.python)
    if not args.refork_python.exists():
        print(f"warning: {args.refork_python} missing; refork runs from {venv}", file=sys.stderr)
        args.refork_python = venv / "bin" / "python"
    info = versions(venv)
    info.pop("bjoern", None), info.pop("gunicorn", None), info.pop("wrk", None)
    code = "import importlib.metadata as md; print(md.version('websockets'), md.version('wsproto'))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    if out.returncode == 0:
        info["websockets"], info["wsproto"] = out.stdout.split()
    code = ("import os, sys, refork; print("
            "sys.version.split()[0], os.path.dirname(os.path.dirname(refork.__file__)))")
    env = {**os.environ, "PYTHONPATH": str(args.refork_path)} if args.refork_path else None
    out = subprocess.run([str(args.refork_python), "-c", code], capture_output=True, text=True, env=env)
    said = out.stdout.strip() or out.stderr.strip()[-200:]
    info["refork_python"], _, info["refork_from"] = said.partition(" ")
    commit = subprocess.run(["git", "-C", info["refork_from"] or str(ROOT), "log", "-1", "--format=%h"],
                            capture_output=True, text=True)  # fmt: skip
    info["refork_commit"] = commit.stdout.strip() or "(not a git checkout)"
    print_versions(info)
    print(f"load average at start: {os.getloadavg()[0]:.1f}")

    wanted = chosen([s.name for s in servers(venv, args.refork_python, args.port)], args.only)
    cases = args.cases.split(",")

    results: dict = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "versions": info,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    data = {}
    for i, case in enumerate(("echo", "idle")):
        if case in cases:
            data[case] = run_case(case, args, venv, wanted, args.port + 50 * i)
    results["load_end"] = os.getloadavg()[0]
    print(f"load average at end: {results['load_end']:.1f}")
    if "echo" in data:
        results["echo"] = {**data["echo"], "summary": report_echo(data["echo"], args, wanted)}
    if "idle" in data:
        results["idle"] = {**data["idle"], "summary": report_idle(data["idle"], args, wanted)}
    if "libs" in cases:
        results["libs_us_per_msg"] = bench_libs(venv)
    if "refork" in wanted:
        print()
        for peer in PEERS:
            if peer not in wanted:
                continue
            target = peer.startswith("uvicorn")  # the target: ahead of uvicorn on both
            if "echo" in results:
                s = results["echo"]["summary"]
                paired, cpu = s[peer].get("paired_mps_ratio"), s[peer].get("paired_cpu_ratio")
                of_medians = ratio_cells(s, "mps", [peer], True)[0]
                verdict = f" [{'PASS' if paired > 1 else 'FAIL'}]" if target and paired else ""
                cpu_cell = fmt(cpu, ".2f", "x")
                print(f"echo: refork / {peer}: {fmt(paired, '.2f', 'x')} msg/s{verdict} (ratio of medians "
                      f"{of_medians}); {peer} CPU per message / refork's: {cpu_cell}")  # fmt: skip
            if "idle" in results:
                cell = ratio_cells(results["idle"]["summary"], "pss_per_conn_kib", [peer], False)[0]
                verdict = ""
                if target and cell != "-":
                    verdict = f" [{'PASS' if float(cell[:-1]) > 1 else 'FAIL'}]"
                print(f"idle: {peer} PSS per connection / refork's: {cell}{verdict}")
    path = write_results("websocket", results)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
