"""Helpers shared by the benchmark scripts: venvs, server processes, wrk, /proc memory readings."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
TICK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- command line


def script_parser(doc: str) -> argparse.ArgumentParser:
    """The parser every benchmark starts from: its docstring as the description (kept as written),
    and --python to choose the benchmark venv."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", help="interpreter version or path; selects benchmarks/.venv-X.Y")
    return parser


def bench_parser(
    doc: str, *, duration: float, port: int, duration_help: str = "seconds of measured load per server"
) -> argparse.ArgumentParser:
    """script_parser plus the options of the scripts that interleave servers over rounds (--duration,
    --rounds, --only, --port); the defaults are the script's own."""
    parser = script_parser(doc)
    parser.add_argument("--duration", type=float, default=duration, help=duration_help)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma-separated server names")
    parser.add_argument("--port", type=int, default=port, help="first port; each round uses a fresh range")
    return parser


def add_profile_options(parser: argparse.ArgumentParser) -> None:
    """--profile and --refork-path, for the scripts that can profile a server (native_hello, django_pg)."""
    parser.add_argument(
        "--profile",
        type=float,
        default=0,
        metavar="S",
        help="after the rounds, profile each server for S seconds under the same load "
        "(py-spy + perf; not counted in the results)",
    )
    parser.add_argument(
        "--refork-path", type=Path, help="run refork from this checkout (PYTHONPATH) instead of the venv's"
    )


def announce(python: str | None, *, command: bool = False, **extra: str) -> tuple[Path, dict]:
    """The venv --python selects and its versions (plus `extra`), printed first so a pasted run says
    what it ran on; command=True also prints the command line."""
    venv = venv_dir(python)
    info = {**versions(venv), **extra}
    print_versions(info)
    if command:
        print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    return venv, info


def print_versions(info: dict) -> None:
    """One line naming every version, for scripts that gather more than versions() does."""
    print("versions:", ", ".join(f"{k} {v}" for k, v in info.items()))


def chosen(names: list[str], only: str | None) -> list[str]:
    """The server names --only asks for (all of names without it); exits on a name that is not one."""
    wanted = only.split(",") if only else names
    unknown = set(wanted) - set(names)
    if unknown:
        sys.exit(f"unknown server(s): {', '.join(sorted(unknown))}; choose from {', '.join(names)}")
    return wanted


# --------------------------------------------------------------------------- venvs


def venv_dir(python: str | None) -> Path:
    """Resolve --python (a version like "3.12", an interpreter path, or None) to benchmarks/.venv-X.Y."""
    if python is None:
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    elif re.fullmatch(r"\d+\.\d+", python):
        version = python
    else:
        out = subprocess.run(
            [python, "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
            capture_output=True, text=True, check=True,
        )
        version = out.stdout.strip()
    venv = BENCH_DIR / f".venv-{version}"
    if not (venv / "bin" / "python").exists():
        sys.exit(f"{venv} does not exist: run benchmarks/setup.sh for Python {version} first")
    return venv


def refork_cmd(venv: Path) -> list[str]:
    script = venv / "bin" / "refork"
    return [str(script)] if script.exists() else [str(venv / "bin" / "python"), "-m", "refork"]


def versions(venv: Path) -> dict[str, str]:
    code = (
        "import importlib.metadata as md, json, sys\n"
        "out = {'python': sys.version.split()[0]}\n"
        "for n in ('refork', 'gunicorn', 'uvicorn', 'httptools', 'uvloop', 'granian', 'bjoern'):\n"
        "    try: out[n] = md.version(n)\n"
        "    except md.PackageNotFoundError: out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    info = json.loads(out.stdout) if out.returncode == 0 else {}
    if shutil.which("wrk") is None:  # the memory benchmarks send their load from Python
        info["wrk"] = None
        return info
    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    info["wrk"] = (wrk.stdout or wrk.stderr).splitlines()[0] if (wrk.stdout or wrk.stderr) else "?"
    return info


# --------------------------------------------------------------------------- process trees


def children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        try:
            kids += [int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except OSError:
            pass
    return kids


def tree(pid: int) -> list[int]:
    """pid and all its descendants, parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        if p not in out:
            out.append(p)
            todo += children(p)
    return out


def alive(pid: int) -> bool:
    """True if pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def smaps_rollup(pid: int) -> dict[str, int]:
    """Fields of /proc/PID/smaps_rollup, in KiB."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            fields[name.strip()] = int(parts[0])
    return fields


def uss_kib(fields: dict[str, int]) -> int:
    return fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0) + fields.get("Private_Hugetlb", 0)


def cpu_seconds(pids: list[int]) -> dict[int, tuple[float, float]]:
    """{pid: (user s, system s)} for each live pid, all its threads included, and the children it
    has reaped (utime + cutime, stime + cstime): read before and after a measured run, it gives the
    CPU the run cost the server, a worker that exited during it (a refork, a recycle) included."""
    out: dict[int, tuple[float, float]] = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        # fields[0] is field 3 (state); utime, stime, cutime, cstime are fields 14 to 17.
        user, system, child_user, child_system = (int(f) / TICK for f in fields[11:15])
        out[pid] = (user + child_user, system + child_system)
    return out


def cpu_delta(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]
) -> tuple[float, float]:
    """User and system seconds spent between the two readings: by the pids alive at the second one
    (a pid new since the first counts from zero), less what a pid gone since the first had spent
    before it (its whole time is now in its reaper's children's time)."""
    user = sum(u - before.get(pid, (0.0, 0.0))[0] for pid, (u, _) in after.items())
    system = sum(s - before.get(pid, (0.0, 0.0))[1] for pid, (_, s) in after.items())
    for pid, (u, s) in before.items():
        if pid not in after:
            user -= u
            system -= s
    return user, system


def cpu_by_pid(
    before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]]
) -> dict[int, float]:
    """{pid: user + system seconds between the two readings}, for the pids alive at the second one:
    how the work was spread over the processes."""
    return {pid: sum(after[pid]) - sum(before.get(pid, (0.0, 0.0))) for pid in after}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    """A server under test: a command line that listens on 127.0.0.1:port."""

    name: str
    interface: str  # "wsgi" or "asgi"
    argv: list[str]
    port: int
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    stderr_path: Path | None = None
    seen: set[int] = field(default_factory=set)

    def start(self, timeout: float = 60.0, path: str = "/") -> str | None:
        """Start and wait until it answers 200 on path. Returns None, or an error message."""
        fd, name = tempfile.mkstemp(prefix=f"bench-{self.name}-", suffix=".stderr")
        self.stderr_path = Path(name)
        env = {**os.environ, **self.env}
        with os.fdopen(fd, "wb") as err:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"failed to start: {self.first_stderr_line()}"
            if self.status(path) == 200:
                self.seen.update(tree(self.proc.pid))
                return None
            time.sleep(0.2)
        self.stop()
        return f"failed to start (no answer in {timeout:.0f}s): {self.first_stderr_line()}"

    def status(self, path: str) -> int | None:
        """The status start() waits for: plain HTTP here, a subclass may ask otherwise (TLS)."""
        return http_get(self.port, path, timeout=2.0)

    def first_stderr_line(self) -> str:
        lines = [ln.strip() for ln in self.stderr_text().splitlines() if ln.strip()]
        if not lines:
            return "(no stderr)"
        # A traceback's first line says nothing; its last line names the error.
        return lines[-1] if lines[0].startswith("Traceback") else lines[0]

    def stderr_text(self) -> str:
        path = self.stderr_path
        return path.read_text(errors="replace") if path and path.exists() else ""  # gone: stopped

    def pids(self) -> list[int]:
        assert self.proc is not None
        found = tree(self.proc.pid)
        self.seen.update(found)
        return found

    def stop(self, grace: float = 10.0) -> list[int]:
        """SIGTERM, then SIGKILL after grace seconds. Returns the pids still alive afterwards (leaks)."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            self.pids()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.pids()
                for pid in self.seen:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.proc.wait(5)
        # Give orphaned workers a moment to notice their parent is gone.
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in self.seen):
            time.sleep(0.1)
        leaked = [p for p in self.seen if alive(p)]
        if leaked:
            print(f"  WARNING: {self.name} left processes behind after stop: {leaked}", file=sys.stderr)
        for pid in leaked:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.stderr_path:
            self.stderr_path.unlink(missing_ok=True)
        self.proc = None
        return leaked


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def finish(server: Server, result: dict, grace: float = 10.0) -> dict:
    """Stop the server after a measurement; result notes the processes it left behind, if any."""
    leaked = server.stop(grace)
    if leaked:
        result["leaked_pids"] = leaked
    return result


def http_get(
    port: int, path: str = "/", timeout: float = 5.0, context: ssl.SSLContext | None = None
) -> int | None:
    """The status of GET path on 127.0.0.1:port (over TLS with a context), None if there is no answer."""
    try:
        if context is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None


# --------------------------------------------------------------------------- wrk

WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * WRK_UNITS[m.group(2)]


def run_wrk(port: int, duration: float, connections: int = 64, threads: int = 2,
            path: str = "/", script: Path | None = None, timeout_s: int = 5, scheme: str = "http") -> dict:
    """Run wrk with keep-alive against 127.0.0.1:port (`scheme` https for TLS). Returns req/s,
    p50/p99 ms, requests and errors."""
    cmd = ["wrk", f"-t{threads}", f"-c{connections}", f"-d{duration:g}s", f"--timeout={timeout_s}s"]
    cmd.append("--latency")
    if script is not None:
        cmd += ["-s", str(script)]
    cmd.append(f"{scheme}://127.0.0.1:{port}{path}")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 30).stdout
    result: dict = {"rps": 0.0, "p50_ms": None, "p99_ms": None, "requests": 0, "errors": 0, "non2xx": 0}
    if m := re.search(r"Requests/sec:\s+([\d.]+)", out):
        result["rps"] = float(m.group(1))
    if m := re.search(r"^\s+50%\s+(\S+)", out, re.M):
        result["p50_ms"] = _ms(m.group(1))
    if m := re.search(r"^\s+99%\s+(\S+)", out, re.M):
        result["p99_ms"] = _ms(m.group(1))
    if m := re.search(r"(\d+) requests in", out):
        result["requests"] = int(m.group(1))
    if m := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out):
        result["errors"] = sum(int(x) for x in m.groups())
    if m := re.search(r"Non-2xx or 3xx responses: (\d+)", out):
        result["non2xx"] = int(m.group(1))
    return result


# --------------------------------------------------------------------------- rounds


def round_order(lineup: list[Server], wanted: list[str], rnd: int) -> list[Server]:
    """The wanted servers of round rnd, the order reversed every other round so that no server
    always runs first."""
    order = [s for s in lineup if s.name in wanted]
    return order[::-1] if rnd % 2 else order


def run_rounds(
    rounds: int,
    lineup: Callable[[int], list[Server]],
    wanted: list[str],
    measure: Callable[[Server], dict],
    describe: Callable[[dict], str],
    *,
    label: str = "",
    after_round: Callable[[], object] | None = None,
) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """Interleave the servers: each round measures every wanted server of lineup(round) once (fresh
    ports a round), so all of them share the machine's noise. A server that fails once ({"error": ...})
    is left out of the later rounds. Prints a line a measurement (describe); returns the results by
    server and the failures."""
    runs: dict[str, list[dict]] = {n: [] for n in wanted}
    failed: dict[str, str] = {}
    for rnd in range(rounds):
        for server in round_order(lineup(rnd), wanted, rnd):
            if server.name in failed:
                continue
            print(f"{label}round {rnd + 1}/{rounds}: {server.name} ...", end=" ", flush=True)
            res = measure(server)
            if "error" in res:
                failed[server.name] = res["error"]
                print(res["error"])
                continue
            runs[server.name].append(res)
            print(describe(res))
        if after_round is not None:
            after_round()
    return runs, failed


def summarize(
    wanted: list[str],
    runs: dict[str, list[dict]],
    failed: dict[str, str],
    of_runs: Callable[[list[dict]], dict],
) -> dict[str, dict]:
    """{server: of_runs(its runs)}, or {"error": why} for a server that failed."""
    return {name: {"error": failed[name]} if name in failed else of_runs(runs[name]) for name in wanted}


def rps_ratio(summary: dict[str, dict], name: str, ref: str) -> float | None:
    """name's median req/s over ref's, None if either is missing."""
    mine, theirs = summary.get(name, {}).get("rps"), summary.get(ref, {}).get("rps")
    return mine / theirs if mine and theirs else None


def wrk_line(res: dict) -> str:
    """The line a plain wrk run prints (hello.py, tls.py)."""
    return f"{res['rps']:.0f} req/s, p99 {fmt(res['p99_ms'], '.2f')} ms, errors {res['errors']}"


def wrk_summary(
    wanted: list[str], runs: dict[str, list[dict]], failed: dict[str, str], ifaces: dict[str, str]
) -> dict[str, dict]:
    """Medians of plain wrk runs, with each server's interface (hello.py, tls.py)."""

    def medians(rs: list[dict]) -> dict:
        return {
            "rps": median([r["rps"] for r in rs]),
            "p99_ms": median([r["p99_ms"] for r in rs]),
            "errors": sum(r["errors"] + r["non2xx"] for r in rs),
        }

    summary = summarize(wanted, runs, failed, medians)
    return {name: {"interface": ifaces[name], **s} for name, s in summary.items()}


def print_wrk_table(summary: dict[str, dict], baseline: dict[str, str]) -> None:
    """wrk_summary as a table, each server's req/s against the baseline of its interface."""
    rows = []
    for name, s in summary.items():
        base = baseline[s["interface"]]
        if "error" in s:
            rows.append([name, s["interface"], "-", "-", "-", "-", s["error"]])
        else:
            vs = fmt(rps_ratio(summary, name, base), ".2f", "x") + f" vs {base}"
            rows.append([name, s["interface"], f"{s['rps']:.0f}", fmt(s["p99_ms"], ".2f"), vs,
                         str(s["errors"]), ""])  # fmt: skip
    print_table(["server", "iface", "req/s", "p99 ms", "ratio", "errors", "note"], rows)


# --------------------------------------------------------------------------- output


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


def write_results(kind: str, data: dict) -> Path:
    RESULTS_DIR.mkdir(exist_ok=True)
    path = RESULTS_DIR / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(data, indent=2, sort_keys=True))
    return path


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def wait_stable(server: Server, min_procs: int, quiet: float = 3.0, timeout: float = 120.0) -> list[int]:
    """Wait until the server's process tree keeps the same pids and RSS (4 MiB buckets) for quiet seconds."""
    deadline = time.monotonic() + timeout
    last: dict[int, int] = {}
    since = time.monotonic()
    while time.monotonic() < deadline:
        snap = {pid: rss_kib(pid) // 4096 for pid in server.pids()}
        if snap != last:
            last, since = snap, time.monotonic()
        elif len(snap) >= min_procs and time.monotonic() - since >= quiet:
            break
        time.sleep(0.5)
    return list(last)


def write_temp(text: str, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix="bench-", suffix=suffix)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return Path(name)


def role(pid: int, root: int) -> str:
    """main / mold / worker / other, from the process title (refork and gunicorn set one)."""
    if pid == root:
        return "main"
    title = cmdline(pid).lower()
    for name in ("mold", "worker", "master"):
        if name in title:
            return name
    return "other"


def send_requests(port: int, paths: list[str], total: int, concurrency: int = 8,
                  timeout: float = 300.0, keepalive: bool = True) -> dict:
    """Send exactly `total` GETs, cycling through paths, from `concurrency` client threads.

    With keepalive=False every request says "Connection: close", so every request is a new
    accept() and the load spreads over all workers instead of sticking to a few connections.
    Reconnects whenever the server closes the connection (gunicorn sync does after every response).
    Bounded: gives up after `timeout` seconds. Returns requests, errors, seconds and req/s.
    """
    lock = threading.Lock()
    state = {"next": 0, "errors": 0, "done": 0}
    samples: list[str] = []  # the first few errors, to say what went wrong
    deadline = time.monotonic() + timeout
    headers = {} if keepalive else {"Connection": "close"}

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        while time.monotonic() < deadline:
            with lock:
                i = state["next"]
                if i >= total:
                    break
                state["next"] += 1
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                conn.request("GET", paths[i % len(paths)], headers=headers)
                resp = conn.getresponse()
                resp.read()
                ok = resp.status == 200
                if not ok and len(samples) < 5:
                    samples.append(f"{paths[i % len(paths)]}: HTTP {resp.status}")
                if resp.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                ok = False
                if len(samples) < 5:
                    samples.append(f"{paths[i % len(paths)]}: {type(exc).__name__}: {exc}")
                if conn is not None:
                    conn.close()
                conn = None
            with lock:
                state["done" if ok else "errors"] += 1
        if conn is not None:
            conn.close()

    start = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 1)
    elapsed = time.monotonic() - start
    return {"requests": state["done"], "errors": state["errors"], "seconds": elapsed,
            "rps": state["done"] / elapsed if elapsed else 0.0, "error_samples": samples}
