"""Hello world WSGI, refork's native loop against its Python loop and the fastest peers.

Every server runs 2 workers on 127.0.0.1 and serves benchmarks/apps/hello_wsgi.py. In each round
every server is started, warmed up for 2 s, measured with `wrk -t2 -c64 -d<D>s --latency`
(keep-alive) and stopped; the order alternates between rounds and the medians over rounds are
printed, with ratios against bjoern (the issue's target: refork-native >= 1.3x bjoern, p99 no
worse) and against refork's Python loop. The `-pool` rows run refork with `--threads 4`: the pool
engine (a Rust I/O thread feeding 4 app threads) and the Python loop's pool.

CPU per request: utime and stime of every live process of the server's tree (all its threads;
/proc/PID/stat), read right before and right after the measured wrk run, the difference divided
by the requests wrk counted. A process that exits during the run would lose its share; the
script warns if the tree changed.

    python3 benchmarks/native_hello.py [--python 3.11] [--duration 10] [--rounds 3] [--only a,b]

refork runs from benchmarks/.venv-X.Y (benchmarks/setup.sh installs this checkout editable).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common import (
    BENCH_DIR,
    RESULTS_DIR,
    Server,
    add_profile_options,
    announce,
    bench_parser,
    chosen,
    cmdline,
    cpu_by_pid,
    cpu_delta,
    cpu_seconds,
    finish,
    fmt,
    median,
    print_table,
    refork_cmd,
    rps_ratio,
    run_rounds,
    run_wrk,
    summarize,
    write_results,
)

APPS = BENCH_DIR / "apps"
BASELINE = "bjoern"
TARGET = ("refork-native", BASELINE, 1.3)


def per_request(counts: dict[str, int], served: int) -> dict[str, float]:
    """Syscalls and context switches per request from a SyscallCounter's counts."""
    out: dict[str, float] = {}
    if "raw_syscalls:sys_enter" in counts:
        out["syscalls_per_req"] = counts["raw_syscalls:sys_enter"] / served
    if "context-switches" in counts:
        out["cswitch_per_req"] = counts["context-switches"] / served
    return out


def native_loaded(pids: list[int]) -> bool:
    """True if a process among pids has refork's Rust extension (refork/_native*.so) mapped: a
    `refork-native` row must measure the native loop, not a silent fall-back to the Python one."""
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        if "/refork/_native" in maps:
            return True
    return False


def check_loop(server: Server) -> str | None:
    """None, or why this refork row does not run the loop it names: each worker logs "WSGI loop:
    native|python"; without that line, `refork-native` must at least have the extension mapped."""
    if not server.name.startswith("refork-"):
        return None
    wanted = "native" if server.name.startswith("refork-native") else "python"
    deadline = time.monotonic() + 5
    said: set[str] = set()
    while time.monotonic() < deadline:
        said = set(re.findall(r"WSGI loop: (\w+)", server.stderr_text()))
        if said:
            break
        time.sleep(0.2)
    if said:
        return (
            None
            if said == {wanted}
            else f"the workers logged WSGI loop {', '.join(sorted(said))}, not {wanted}"
        )
    if wanted == "native" and not native_loaded(server.pids()):
        return "native loop not loaded (refork/_native*.so is in no process of the tree)"
    return None


class SyscallCounter:
    """`perf stat` counting syscalls (raw_syscalls:sys_enter) and context switches of the given
    processes (all their threads) between start and stop; a no-op where perf is missing."""

    EVENTS = ("raw_syscalls:sys_enter", "context-switches")

    def __init__(self, pids: list[int], enabled: bool = True) -> None:
        self.proc: subprocess.Popen[str] | None = None
        if enabled and shutil.which("perf"):
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x,", "-e", ",".join(self.EVENTS), "-p", ",".join(map(str, pids))],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            time.sleep(0.2)  # attached before the load starts

    def stop(self) -> dict[str, int]:
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return {}
        counts: dict[str, int] = {}
        for line in err.splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2] in self.EVENTS and fields[0].isdigit():
                counts[fields[2]] = int(fields[0])
        return counts


class TreeCost:
    """What a server's process tree spends over the with-block (the measured run): CPU from
    /proc/PID/stat of the live pids right before and after, and syscalls and context switches from
    perf stat (SyscallCounter) where perf is and `syscalls` is on."""

    def __init__(self, server: Server, syscalls: bool = True) -> None:
        self.server, self.syscalls = server, syscalls
        self.pids = server.pids()  # the tree as it stands after the warm-up

    def __enter__(self) -> TreeCost:
        self.counter = SyscallCounter(self.pids, self.syscalls)
        self.before = cpu_seconds(self.pids)
        return self

    def __exit__(self, *exc: object) -> None:
        self.after = cpu_seconds(self.server.pids())
        self.counts = self.counter.stop()
        self.user, self.system = cpu_delta(self.before, self.after)

    def per_request(self, requests: int) -> dict:
        """CPU us, syscalls and context switches per request; tree_changed if a pid came or went (a
        process that exits during the run loses its share)."""
        served = max(requests, 1)
        out = {
            **per_request(self.counts, served),
            "user_us": self.user / served * 1e6,
            "sys_us": self.system / served * 1e6,
        }
        if set(self.after) != set(self.before):
            out["tree_changed"] = sorted(set(self.before) ^ set(self.after))
        return out


def busiest(pids: list[int], window: float = 1.0) -> int:
    """The pid among pids that used the most CPU over the next `window` seconds."""
    before = cpu_seconds(pids)
    time.sleep(window)
    used = cpu_by_pid(before, cpu_seconds(pids))
    return max(used, key=lambda p: used[p])


def py_spy_summary(raw: Path, top: int = 25, app_frame: str | None = None) -> list[str]:
    """Lines: share of the samples per leaf function (self) and per function anywhere on the stack
    (inclusive), from py-spy's raw (collapsed) output."""
    self_: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = in_app = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        if app_frame and app_frame in stack:
            in_app += n
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            for f in stack.split(";")
            if not f.startswith("process ") and not f.startswith("thread ")
        ]
        if not frames:
            continue
        self_[frames[-1]] = self_.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    if not total:
        return ["(no samples)"]
    out = [f"py-spy: {total} samples of the threads holding the GIL"]
    if app_frame:
        out.append(
            f"  {in_app / total:6.1%}  inside the app call ({app_frame}), "
            f"{1 - in_app / total:6.1%} outside it "
            "(the server, and stacks py-spy could not walk to the root)"
        )
    out.append("self (leaf) shares:")
    out += [f"  {n / total:6.1%}  {f}" for f, n in sorted(self_.items(), key=lambda x: -x[1])[:top]]
    out.append("inclusive shares (the function or anything it called):")
    out += [f"  {n / total:6.1%}  {f}" for f, n in sorted(incl.items(), key=lambda x: -x[1])[:top]]
    return out


def perf_summary(data: Path, top: int = 25) -> list[str]:
    """Lines: perf's shares by shared object, then by symbol (self time, all threads)."""
    out: list[str] = []
    for sort in ("dso", "dso,sym"):
        rep = subprocess.run(
            [
                "perf",
                "report",
                "-i",
                str(data),
                "--stdio",
                "--no-children",
                "-g",
                "none",
                "--sort",
                sort,
                "--percent-limit",
                "0.5",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [ln for ln in rep.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
        out.append(f"perf report --no-children --sort {sort}:")
        out += ["  " + ln.strip() for ln in lines[:top]]
    return out


SYSCALLS = (
    "futex",
    "read",
    "write",
    "writev",
    "recvfrom",
    "sendto",
    "recvmsg",
    "sendmsg",
    "epoll_wait",
    "epoll_pwait",
    "epoll_ctl",
    "poll",
    "ppoll",
    "select",
    "clock_nanosleep",
    "accept4",
    "sched_yield",
)


def syscall_summary(perf_stat_stderr: str, seconds: float) -> list[str]:
    """Lines: syscalls per second of the tree, by name (perf stat's csv output)."""
    counts: dict[str, int] = {}
    for line in perf_stat_stderr.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].isdigit():
            counts[fields[2].removeprefix("syscalls:sys_enter_")] = int(fields[0])
    total = counts.pop("raw_syscalls:sys_enter", 0)
    if not total:
        return ["perf stat: no syscall counts"]
    out = [f"syscalls of the tree: {total / seconds:,.0f}/s; by name:"]
    named = sorted(((n, c) for n, c in counts.items() if c), key=lambda x: -x[1])
    out += [f"  {c / total:6.1%}  {n} ({c / seconds:,.0f}/s)" for n, c in named]
    others = total - sum(counts.values())
    if others > 0:  # perf scales multiplexed counters: the named ones can add up to a little over the total
        out.append(f"  {others / total:6.1%}  others")
    return out


def profile(
    server: Server, venv: Path, seconds: float, load: Callable[[float], object], app_frame: str | None = None
) -> list[str]:
    """Under `load` (called with a duration, in a thread), py-spy (--gil, non-blocking) on the
    busiest process of the tree and perf (-g, 499 Hz) on the whole tree, for `seconds`. Returns
    the summary lines; the raw files stay in benchmarks/results/."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS_DIR.mkdir(exist_ok=True)
    raw = RESULTS_DIR / f"profile-{server.name}-{stamp}.pyspy.txt"
    data = RESULTS_DIR / f"profile-{server.name}-{stamp}.perf.data"
    thread = threading.Thread(target=load, args=(seconds + 4,), daemon=True)
    thread.start()
    time.sleep(1.5)
    pids = server.pids()
    target = busiest(pids)
    tools = [
        subprocess.Popen(
            [
                str(venv / "bin" / "py-spy"),
                "record",
                "--nonblocking",
                "--gil",
                "--format",
                "raw",
                "-r",
                "200",
                "-d",
                str(int(seconds)),
                "-p",
                str(target),
                "-o",
                str(raw),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    ]
    if shutil.which("perf"):
        tools.append(
            subprocess.Popen(
                [
                    "perf",
                    "record",
                    "-F",
                    "499",
                    "-g",
                    "-o",
                    str(data),
                    "-p",
                    ",".join(map(str, pids)),
                    "--",
                    "sleep",
                    str(int(seconds)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    stat = None
    if shutil.which("perf"):
        events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS) + ",raw_syscalls:sys_enter"
        stat = subprocess.Popen(
            ["perf", "stat", "-x,", "-e", events, "-p", ",".join(map(str, pids)),
             "--", "sleep", str(int(seconds))],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        tools.append(stat)
    errors: dict[subprocess.Popen[str], str] = {}
    for tool in tools:
        _, errors[tool] = tool.communicate(timeout=seconds + 120)
        if tool.returncode != 0:
            print(
                f"  {tool.args[0]} failed: {errors[tool].strip().splitlines()[-1:] or '?'}", file=sys.stderr
            )
    thread.join()
    lines = [f"profile of {server.name}: py-spy on pid {target} ({cmdline(target)[:80]}), perf on {pids}"]
    if raw.exists():
        lines += py_spy_summary(raw, app_frame=app_frame)
    if data.exists():
        lines += perf_summary(data)
    if stat is not None:
        lines += syscall_summary(errors.get(stat, ""), seconds)
    (RESULTS_DIR / f"profile-{server.name}-{stamp}.txt").write_text("\n".join(lines) + "\n")
    return lines


def servers(venv: Path, port: int, refork_path: Path | None = None) -> list[Server]:
    """All contenders, in run order. Ports are port, port+1, ...; refork_path: a checkout whose
    refork the refork rows run (PYTHONPATH; its extensions built in place)."""
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    refork = [*refork_cmd(venv), "-w", "2", "--chdir", str(APPS), "-b", f"{bind}:{{port}}"]
    specs = [
        ("refork-native", [*refork, "--wsgi-loop", "native", "hello_wsgi:app"]),
        ("refork-python", [*refork, "--wsgi-loop", "python", "hello_wsgi:app"]),
        ("refork-native-pool", [*refork, "--wsgi-loop", "native", "--threads", "4", "hello_wsgi:app"]),
        ("refork-python-pool", [*refork, "--wsgi-loop", "python", "--threads", "4", "hello_wsgi:app"]),
        (
            "bjoern",
            [str(bin_ / "python"), str(APPS / "bjoern_run.py"), "hello_wsgi:app", bind, "{port}", "2"],
        ),
        (
            "granian-wsgi",
            [
                str(bin_ / "granian"),
                "--interface",
                "wsgi",
                "--workers",
                "2",
                "--host",
                bind,
                "--port",
                "{port}",
                "--no-ws",
                "--log-level",
                "warning",
                "hello_wsgi:app",
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
                "4",
                "-b",
                f"{bind}:{{port}}",
                "--log-level",
                "warning",
                "hello_wsgi:app",
            ],
        ),
    ]
    return [
        Server(
            name,
            "wsgi",
            [a.replace("{port}", str(port + i)) for a in argv],
            port + i,
            APPS,
            env={"PYTHONPATH": str(refork_path)} if refork_path and name.startswith("refork") else {},
        )
        for i, (name, argv) in enumerate(specs)
    ]


def bench_one(server: Server, duration: float, connections: int, syscalls: bool = True) -> dict:
    """Start, warm up 2 s, measure (wrk + CPU of the tree), stop, check for leftovers."""
    if error := server.start() or check_loop(server):
        server.stop()
        return {"error": error}
    run_wrk(server.port, 2, connections=connections)
    with TreeCost(server, syscalls) as cost:
        result = run_wrk(server.port, duration, connections=connections)
    result.update(cost.per_request(result["requests"]))
    result.update(processes=len(cost.pids), cpu_user_s=cost.user, cpu_sys_s=cost.system)
    if "tree_changed" in result:
        print(f"  WARNING: {server.name}'s process tree changed during the run", file=sys.stderr)
    return finish(server, result)


def describe(res: dict) -> str:
    """The line one measured run prints."""
    return (
        f"{res['rps']:.0f} req/s, p50 {fmt(res['p50_ms'], '.2f')} ms, "
        f"p99 {fmt(res['p99_ms'], '.2f')} ms, "
        f"cpu {res['user_us']:.1f}+{res['sys_us']:.1f} us/req, "
        f"syscalls {fmt(res.get('syscalls_per_req'), '.2f')}/req, "
        f"cswitch {fmt(res.get('cswitch_per_req'), '.3f')}/req, "
        f"errors {res['errors'] + res['non2xx']}"
    )


def medians(rs: list[dict]) -> dict:
    """A server's summary: medians over its rounds (and each round's req/s), errors summed."""
    return {
        "rps": median([r["rps"] for r in rs]),
        "rounds": [round(r["rps"]) for r in rs],
        "p50_ms": median([r["p50_ms"] for r in rs]),
        "p99_ms": median([r["p99_ms"] for r in rs]),
        "user_us": median([r["user_us"] for r in rs]),
        "sys_us": median([r["sys_us"] for r in rs]),
        "syscalls_per_req": median([r.get("syscalls_per_req") for r in rs]),
        "cswitch_per_req": median([r.get("cswitch_per_req") for r in rs]),
        "errors": sum(r["errors"] + r["non2xx"] for r in rs),
    }


def main() -> None:
    parser = bench_parser(__doc__, duration=10.0, port=19400)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--no-syscalls", action="store_true", help="do not count syscalls with perf stat")
    add_profile_options(parser)
    args = parser.parse_args()

    venv, info = announce(args.python, command=True)
    wanted = chosen([s.name for s in servers(venv, args.port, args.refork_path)], args.only)
    loads: list[float] = [os.getloadavg()[0]]
    runs, failed = run_rounds(
        args.rounds,
        lambda rnd: servers(venv, args.port + 10 * rnd, args.refork_path),
        wanted,
        lambda server: bench_one(server, args.duration, args.connections, not args.no_syscalls),
        describe,
        after_round=lambda: loads.append(os.getloadavg()[0]),
    )
    summary = summarize(wanted, runs, failed, medians)

    print(
        f"\nmedian of {args.rounds} rounds, {args.duration:g}s each, "
        f"wrk -t2 -c{args.connections} keep-alive, "
        f"2 workers, Python {info.get('python')}; load average {', '.join(f'{x:.1f}' for x in loads)}"
    )
    rows = []
    for name, s in summary.items():
        if "error" in s:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", s["error"]])
            continue
        rows.append(
            [
                name,
                f"{s['rps']:.0f}",
                " ".join(str(x) for x in s["rounds"]),
                fmt(s["p50_ms"], ".2f"),
                fmt(s["p99_ms"], ".2f"),
                fmt(s["user_us"], ".1f"),
                fmt(s["sys_us"], ".1f"),
                fmt(s["syscalls_per_req"], ".2f"),
                fmt(s["cswitch_per_req"], ".3f"),
                fmt(rps_ratio(summary, name, BASELINE), ".2f", "x"),
                fmt(rps_ratio(summary, name, "refork-python"), ".2f", "x"),
                str(s["errors"]),
            ]
        )
    print_table(
        [
            "server",
            "req/s",
            "rounds",
            "p50 ms",
            "p99 ms",
            "user us/req",
            "sys us/req",
            "syscalls/req",
            "cswitch/req",
            f"vs {BASELINE}",
            "vs refork-python",
            "errors",
        ],
        rows,
    )

    checks: dict[str, dict] = {}
    name, ref, target = TARGET
    if name in summary and ref in summary and "error" not in summary[name] and "error" not in summary[ref]:
        r = rps_ratio(summary, name, ref)
        ok = r is not None and r >= target
        checks["rps"] = {"ratio": r, "target": target, "pass": ok}
        mine_p99, ref_p99 = summary[name]["p99_ms"], summary[ref]["p99_ms"]
        ok99 = mine_p99 is not None and ref_p99 is not None and mine_p99 <= ref_p99
        checks["p99"] = {"mine": mine_p99, "ref": ref_p99, "pass": ok99}
        print()
        print(f"[{'PASS' if ok else 'FAIL'}] {name} >= {target:.1f}x {ref}: {fmt(r, '.2f', 'x')}")
        print(
            f"[{'PASS' if ok99 else 'FAIL'}] {name} p99 <= {ref}'s: {fmt(mine_p99, '.2f')} ms vs "
            f"{fmt(ref_p99, '.2f')} ms"
        )

    if args.profile:
        for server in servers(venv, args.port + 10 * args.rounds, args.refork_path):
            if server.name not in wanted or server.name in failed or server.start():
                server.stop()
                continue
            run_wrk(server.port, 2, connections=args.connections)
            port = server.port
            print()
            print(
                "\n".join(
                    profile(
                        server,
                        venv,
                        args.profile,
                        lambda d, port=port: run_wrk(port, d, connections=args.connections),
                        app_frame="app (hello_wsgi.py",
                    )
                )
            )
            server.stop()

    path = write_results(
        "native-hello",
        {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "argv": sys.argv,
            "versions": info,
            "loads": loads,
            "duration": args.duration,
            "rounds": args.rounds,
            "runs": runs,
            "summary": summary,
            "checks": checks,
        },
    )
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
