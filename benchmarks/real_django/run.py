"""Memory on a real app: a Wagtail site (prepare.py) served by gunicorn and refork, 4 workers each.

Every setup gets the same mixed load from a few client threads, each logged in to the Wagtail
admin: the admin's dashboard, page explorer, edit forms, image listing and chooser, page chooser
and search; the 30 public pages, the blog's tag filter and the site search; the static files those
pages link to (WhiteNoise; in the refork-static setup, refork's --static mount of the collected
directory, WhiteNoise out of the app). --requests of it, then a quarter more until a quarter passes
without a refork, then --settle more (so that workers forked by a late refork have served their
share too). Then the whole process tree is measured from /proc: total PSS, USS and Private_Dirty of
each process and of each kind of mapping, the requests each worker served since its fork (from the
X-Worker-Pid header the site adds), and for refork the reforks the log reports; and the pages (all
but the static files) answered per second of load. Setups alternate over rounds; the table gives
medians.

    benchmarks/real_django/setup.sh python3.12                  # once per interpreter
    python3 benchmarks/real_django/run.py --python 3.12 [--rounds 2] [--requests 1200] [--only A,B]
    python3 benchmarks/real_django/run.py --python 3.12 --only refork --refork-path CHECKOUT  # another refork
    python3 benchmarks/real_django/run.py --table               # the newest result per Python

The site is made by prepare.py on first use (benchmarks/real_django/.site-X.Y).
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlencode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from common import (  # noqa: E402
    RESULTS_DIR,
    Server,
    fmt,
    free_port,
    median,
    print_table,
    role,
    round_order,
    smaps_rollup,
    uss_kib,
    wait_stable,
    write_results,
)

APP = "bench_wsgi:application"
FREEZE_CONF = HERE.parent / "cow" / "gunicorn_freeze.conf.py"
TRIM_CONF = HERE.parent / "cow" / "gunicorn_trim.conf.py"
USERNAME, PASSWORD = "admin", "bench-admin-password"  # prepare.py's
PRELOAD, FREEZE, TUNED = "gunicorn-preload", "gunicorn-preload-freeze", "gunicorn-preload-freeze-trim"
LOAD_SEED = 7

# name -> refork flags. "refork" is the defaults; every other setup names each policy flag it relies
# on (--refork-after, --mold-idle-exit), so that it means the same whatever the defaults are.
GUNICORN_SETUPS = ["gunicorn", PRELOAD, FREEZE, TUNED]
ONE_GENERATION = ["--refork-after", "off", "--mold-idle-exit", "off"]
REFORK_SETUPS: dict[str, list[str]] = {
    "refork": [],
    # The first generation only, its mold kept: what refork does with no policy.
    "refork-one-generation": ONE_GENERATION,
    "refork-idle-exit": ["--refork-after", "off", "--mold-idle-exit", "1"],
    "refork-after-25": ["--refork-after", "25,50,off", "--mold-idle-exit", "off"],
    "refork-after-50": ["--refork-after", "50,100,off", "--mold-idle-exit", "off"],
    "refork-after-100": ["--refork-after", "100,200,off", "--mold-idle-exit", "off"],
    "refork-after-50-idle-exit": ["--refork-after", "50,100,off", "--mold-idle-exit", "1"],
    "refork-after-100-idle-exit": ["--refork-after", "100,200,off", "--mold-idle-exit", "1"],
    "refork-after-25-idle-exit": ["--refork-after", "25,50,off", "--mold-idle-exit", "1"],
    "refork-after-50-idle-exit-jemalloc": ["--refork-after", "50,100,off", "--mold-idle-exit", "1",
                                           "--allocator", "jemalloc"],
    # Pitchfork's policy (the last count repeats), with the mold let go after 1 s or 10 s idle.
    "refork-after-50-100-1000-idle-exit-1": ["--refork-after", "50,100,1000", "--mold-idle-exit", "1"],
    "refork-after-50-100-1000-idle-exit-10": ["--refork-after", "50,100,1000", "--mold-idle-exit", "10"],
    "refork-warmup": [*ONE_GENERATION, "{warmup}"],
    # The static files from refork's mount of the collected directory, WhiteNoise left out of the app.
    "refork-static": ["{static}"],
    "refork-static-one-generation": [*ONE_GENERATION, "{static}"],
    "refork-jemalloc": [*ONE_GENERATION, "--allocator", "jemalloc"],
}
DEFAULT_ONLY = [*GUNICORN_SETUPS, "refork", "refork-one-generation", "refork-after-50-100-1000-idle-exit-1",
                "refork-after-50-100-1000-idle-exit-10"]


# --------------------------------------------------------------------------- site and servers


def venv_for(python: str) -> Path:
    venv = HERE / f".venv-{python}"
    if not (venv / "bin" / "python").exists():
        sys.exit(f"{venv} does not exist: run benchmarks/real_django/setup.sh for Python {python} first")
    return venv


def site_paths(venv: Path, python: str) -> dict[str, list[str]]:
    """paths.json of the site for this interpreter, made by prepare.py if missing."""
    paths = HERE / f".site-{python}" / "paths.json"
    if not paths.exists():
        subprocess.run([str(venv / "bin" / "python"), str(HERE / "prepare.py")], cwd=HERE, check=True)
    return json.loads(paths.read_text())


STATIC_SETTINGS = "bench_settings_static"  # bench_settings without WhiteNoise's middleware


def static_flags(python: str) -> list[str]:
    """--static for the site's STATIC_ROOT (collected by prepare.py: hashed names, .gz and .br)."""
    return ["--static", f"/static={HERE / f'.site-{python}' / 'static'}"]


def warmup_flags(paths: dict[str, list[str]]) -> list[str]:
    """--warmup for every public page (no session: admin paths would only redirect to the login)."""
    return [arg for path in [*paths["public"], "/admin/login/"] for arg in ("--warmup", path)]


def server(name: str, venv: Path, workers: int, paths: dict[str, list[str]], python: str,
           refork_path: Path | None = None) -> Server:
    port = free_port()
    env = {}
    bind = f"127.0.0.1:{port}"
    b = venv / "bin"
    if name in REFORK_SETUPS:
        expand = {"{warmup}": warmup_flags(paths), "{static}": static_flags(python)}
        flags = [f for flag in REFORK_SETUPS[name] for f in expand.get(flag, [flag])]
        if "{static}" in REFORK_SETUPS[name]:
            env["DJANGO_SETTINGS_MODULE"] = STATIC_SETTINGS
        argv = [str(b / "refork"), "-w", str(workers), "--chdir", str(HERE), "-b", bind, *flags, APP]
        if refork_path is not None:  # refork from another checkout, ahead of the venv's
            env["PYTHONPATH"] = str(refork_path)
    else:
        argv = [str(b / "gunicorn"), "-w", str(workers), "--chdir", str(HERE), "-b", bind,
                "--timeout", "120", "--log-level", "info"]
        if name in (PRELOAD, FREEZE, TUNED):
            argv.append("--preload")
        if name in (FREEZE, TUNED):
            argv += ["-c", str(FREEZE_CONF if name == FREEZE else TRIM_CONF)]
        argv.append(APP)
    return Server(name, "wsgi", argv, port, HERE, env=env)


# --------------------------------------------------------------------------- load


class Client:
    """One logged-in admin user: a cookie jar over fresh connections (Connection: close, so every
    request is a new accept() and the load spreads over all workers)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, body: str | None = None) -> tuple[int, dict[str, str], bytes]:
        headers = {"Connection": "close"}
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        if body is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            for key, value in resp.getheaders():
                if key.lower() == "set-cookie":
                    name, _, rest = value.partition("=")
                    self.cookies[name.strip()] = rest.split(";", 1)[0]
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def login(self) -> list[tuple[int, dict[str, str]]]:
        """The admin's login form, as a browser sends it: GET (CSRF cookie and token), POST."""
        status, headers, page = self.request("GET", "/admin/login/")
        m = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if not m:
            raise RuntimeError(f"no CSRF token on /admin/login/ (HTTP {status})")
        form = {"csrfmiddlewaretoken": m.group(1).decode(), "username": USERNAME, "password": PASSWORD,
                "next": "/admin/"}
        status2, headers2, _ = self.request("POST", "/admin/login/", urlencode(form))
        if status2 != 302 or "sessionid" not in self.cookies:
            raise RuntimeError(f"login failed: POST /admin/login/ answered {status2}")
        return [(status, headers), (status2, headers2)]


def load_sequence(paths: dict[str, list[str]], total: int, seed: int) -> list[str]:
    """total paths: every admin, public and static path once a cycle, each cycle shuffled."""
    rng = random.Random(seed)
    cycle = [*paths["admin"], *paths["public"], *paths["static"]]
    out: list[str] = []
    while len(out) < total:
        rng.shuffle(cycle)
        out += cycle
    return out[:total]


def run_load(port: int, sequence: list[str], clients: int, per_pid: Counter[int]) -> dict:
    """Send sequence from `clients` threads, each logged in first. Any answer that is not 2xx or
    3xx is an error. per_pid counts the answers of each worker (X-Worker-Pid)."""
    lock = threading.Lock()
    state = {"next": 0, "ok": 0, "errors": 0, "static": 0}
    samples: list[str] = []

    def note(status: int | None, headers: dict[str, str], what: str) -> None:
        ok = status is not None and 200 <= status < 400
        with lock:
            state["ok" if ok else "errors"] += 1
            if "x-worker-pid" in headers:
                per_pid[int(headers["x-worker-pid"])] += 1
            if not ok and len(samples) < 5:
                samples.append(f"{what}: {status}")

    def thread() -> None:
        client = Client(port)
        try:
            for status, headers in client.login():
                note(status, headers, "login")
        except (OSError, http.client.HTTPException, RuntimeError) as exc:
            note(None, {}, f"login: {exc}")
        while True:
            with lock:
                i = state["next"]
                if i >= len(sequence):
                    return
                state["next"] += 1
                state["static"] += sequence[i].startswith("/static/")
            try:
                status, headers, _ = client.request("GET", sequence[i])
                note(status, headers, sequence[i])
            except (OSError, http.client.HTTPException) as exc:
                note(None, {}, f"{sequence[i]}: {type(exc).__name__}: {exc}")

    start = time.monotonic()
    threads = [threading.Thread(target=thread, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - start
    return {"requests": state["ok"] + state["errors"], "errors": state["errors"], "seconds": seconds,
            "static": state["static"], "error_samples": samples}


# --------------------------------------------------------------------------- measurement


def mapping_kind(name: str) -> str:
    """Group /proc/PID/smaps mappings: the heaps, the interpreter, extension modules, the rest."""
    if name in ("", "[anon]"):
        return "anonymous (pymalloc arenas, large mallocs)"
    if name == "[heap]":
        return "[heap] (malloc)"
    if name.startswith("["):
        return name
    base = name.rsplit("/", 1)[-1]
    if base.startswith(("python3", "libpython3")):
        return "python binary"
    if ".cpython-" in base or ".abi3." in base or "/site-packages/" in name:
        return "extension modules"
    if base.startswith(("libc.", "libm.", "ld-linux")):
        return "libc"
    return "other files"


def private_by_mapping(pid: int) -> dict[str, int]:
    """USS (Private_Clean + Private_Dirty, KiB) of pid by kind of mapping."""
    out: Counter[str] = Counter()
    kind = ""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return {}
    for line in text.splitlines():
        first = line.split(None, 1)[0]
        if "-" in first and not first.endswith(":"):  # a mapping's header line
            parts = line.split(None, 5)
            kind = mapping_kind(parts[5].strip() if len(parts) > 5 else "")
        elif first in ("Private_Clean:", "Private_Dirty:"):
            out[kind] += int(line.split()[1])
    return dict(out)


def measure(srv: Server, min_procs: int, per_pid: Counter[int]) -> dict:
    assert srv.proc is not None
    root = srv.proc.pid
    procs = []
    for pid in wait_stable(srv, min_procs):
        try:
            f = smaps_rollup(pid)
        except OSError:
            continue
        procs.append({"pid": pid, "role": role(pid, root), "rss": f.get("Rss", 0), "pss": f.get("Pss", 0),
                      "uss": uss_kib(f), "private_dirty": f.get("Private_Dirty", 0),
                      "requests": per_pid.get(pid, 0)})
    workers = [p for p in procs if p["role"] == "worker"] or [p for p in procs if p["role"] == "other"]
    mold = next((p for p in procs if p["role"] == "mold"), None)
    main = next((p for p in procs if p["role"] == "main"), None)
    by_uss = sorted(workers, key=lambda p: p["uss"])
    mid = by_uss[len(by_uss) // 2] if by_uss else None
    return {
        "processes": procs,
        "total_pss": sum(p["pss"] for p in procs),
        "workers": len(workers),
        "worker_uss": median([p["uss"] for p in workers]),
        "worker_private_dirty": median([p["private_dirty"] for p in workers]),
        "worker_requests": sorted(p["requests"] for p in workers),
        "main_uss": main and main["uss"],
        "mold_uss": mold and mold["uss"],
        "worker_mappings": mid and private_by_mapping(mid["pid"]),
        "mold_mappings": mold and private_by_mapping(mold["pid"]),
    }


def bench_one(srv: Server, workers: int, requests: int, settle: int, clients: int,
              paths: dict[str, list[str]], seed: int) -> dict:
    error = srv.start(timeout=180.0, path="/")
    if error:
        srv.stop()
        return {"error": error}
    per_pid: Counter[int] = Counter()
    t0 = time.monotonic()
    try:
        wait_stable(srv, workers + 1)
        load = run_load(srv.port, load_sequence(paths, requests, seed), clients, per_pid)

        def more(count: int, extra_seed: int) -> None:
            extra = run_load(srv.port, load_sequence(paths, count, extra_seed), clients, per_pid)
            for key in ("requests", "errors", "seconds", "static"):
                load[key] += extra[key]
            load["error_samples"] += extra["error_samples"]

        # Reforks the load triggers: a quarter more until a quarter ends with the workers it
        # started with (at most 8 times).
        for extra_round in range(8):
            before = set(wait_stable(srv, workers + 1))
            more(requests // 4, seed + extra_round + 1)
            if set(srv.pids()) == before:
                break
        first = measure(srv, workers + 1, per_pid)
        # Then the same for every setup: `settle` requests more, so that every measured worker,
        # forked by a refork or not, has served its share of them since its fork.
        more(settle, seed + 100)
        result = measure(srv, workers + 1, per_pid)
        result["after_reforks"] = {k: first[k] for k in ("total_pss", "worker_uss", "worker_requests",
                                                         "main_uss", "mold_uss")}
        result["load"] = load
        log = srv.stderr_text()
        result["reforks"] = len(re.findall(r"promoting worker \d+ \(pid \d+, \d+ requests\) to mold", log))
        result["promotions"] = re.findall(r"promoting worker \d+ \(pid \d+, (\d+) requests\)", log)
        result["mold_idle_exits"] = log.count("stopping it to free its memory")
        immortal = re.findall(r"immortalize (on|off|unsupported[^(\n]*|fell back[^\n]*)", log)
        result["immortalize"] = sorted(set(immortal))
        result["seconds"] = time.monotonic() - t0
    finally:
        leaked = srv.stop()
    if leaked:
        result["leaked_pids"] = leaked
    return result


# --------------------------------------------------------------------------- output


def mib(kib: float | None) -> str:
    return fmt(kib and kib / 1024)


def describe(res: dict) -> str:
    load = res["load"]
    extra = f", {res['reforks']} reforks" if res.get("reforks") else ""
    return (f"total PSS {res['total_pss'] / 1024:.1f} MiB, worker USS {mib(res['worker_uss'])} MiB, "
            f"{load['requests']} requests ({load['requests'] / load['seconds']:.0f}/s; "
            f"pages {pages_per_second(load):.1f}/s), "
            f"{load['errors']} errors{extra} ({res['seconds']:.0f}s)")


def pages_per_second(load: dict) -> float:
    """The pages (every request but the static files' and the logins') answered per second of load."""
    return (load["requests"] - load.get("static", 0)) / load["seconds"]


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0]["error"] if runs else "not run"}
    return {
        "total_pss": median([r["total_pss"] for r in ok]),
        "worker_uss": median([r["worker_uss"] for r in ok]),
        "worker_private_dirty": median([r["worker_private_dirty"] for r in ok]),
        "main_uss": median([r["main_uss"] for r in ok]),
        "mold_uss": median([r["mold_uss"] for r in ok]),
        "reforks": [r.get("reforks", 0) for r in ok],
        "errors": sum(r["load"]["errors"] for r in ok),
        "requests": [r["load"]["requests"] for r in ok],
        "pages_per_second": median([pages_per_second(r["load"]) for r in ok]),
        "worker_requests": [r["worker_requests"] for r in ok],
        "runs": [r["total_pss"] for r in ok],
        "after_reforks": {key: median([r["after_reforks"][key] for r in ok if "after_reforks" in r])
                          for key in ("total_pss", "worker_uss", "mold_uss")},
    }


def print_summary(summary: dict[str, dict], python: str) -> None:
    pre, frz = summary.get(PRELOAD, {}).get("total_pss"), summary.get(FREEZE, {}).get("total_pss")
    tuned = summary.get(TUNED, {}).get("total_pss")
    rows = []
    for name, s in summary.items():
        if "error" in s:
            rows.append([name, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", s["error"][:60]])
            continue
        rows.append([
            name, mib(s["total_pss"]), "/".join(f"{v / 1024:.0f}" for v in s["runs"]),
            fmt(s["total_pss"] / pre if pre else None, ".2f", "x"),
            fmt(s["total_pss"] / frz if frz else None, ".2f", "x"),
            fmt(s["total_pss"] / tuned if tuned else None, ".2f", "x"),
            mib(s["worker_uss"]), mib(s["main_uss"]), mib(s["mold_uss"]),
            "/".join(str(n) for n in s["reforks"]), fmt(s.get("pages_per_second"), ".1f"), str(s["errors"]),
        ])
    print(f"\nPython {python}: medians over {max(len(s.get('runs', [])) for s in summary.values())} runs")
    print_table(["setup", "total PSS MiB", "runs", "vs preload", "vs preload+freeze", "vs tuned",
                 "worker USS", "main USS", "mold USS", "reforks", "pages/s", "errors"], rows)


def latest_results() -> dict[str, dict]:
    """Per Python (and per Python and commit for the runs with --refork-path: "3.14 @ ed39bc6"), each
    setup's summary from the newest result file that has it; with the files and commits used."""
    merged: dict[str, dict] = {}
    for path in sorted(RESULTS_DIR.glob("realdjango-py*.json"), key=lambda p: p.stat().st_mtime):
        data = json.loads(path.read_text())
        key = f"{data['python']} @ {data['commit']}" if data.get("refork_path") else data["python"]
        entry = merged.setdefault(key, {"summary": {}, "files": [], "commits": [],
                                        "versions": data["versions"]})
        entry["summary"].update(data["summary"])
        entry["files"].append(path.name)
        if data["commit"] not in entry["commits"]:
            entry["commits"].append(data["commit"])
    return dict(sorted(merged.items()))


def columns(results: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """One column per Python: the setups of its plain runs, and those of a run from another checkout
    as rows "setup @ commit". gunicorn does not change with refork's commit: the plain run's gunicorn
    rows are the baselines of every row."""
    cols: dict[str, dict[str, dict]] = {}
    for key, data in results.items():
        python, _, commit = key.partition(" @ ")
        col = cols.setdefault(python, {})
        for name, s in data["summary"].items():
            if not commit:
                col[name] = s
            elif name in GUNICORN_SETUPS:
                col.setdefault(name, s)
            else:
                col[f"{name} @ {commit}"] = s
    return dict(sorted(cols.items(), key=lambda kv: tuple(int(n) for n in kv[0].split("."))))


def print_table_all() -> None:
    """Total PSS of every setup, one column per Python, with the ratios to gunicorn --preload and to
    gunicorn --preload + freeze; then each Python's details."""
    results = latest_results()
    if not results:
        sys.exit("no results yet: run benchmarks/real_django/run.py --python X.Y first")
    cols = columns(results)
    names: list[str] = []
    for col in cols.values():
        names += [n for n in col if n not in names]
    print("total PSS MiB (x gunicorn --preload / x gunicorn --preload + freeze / x the tuned gunicorn: "
          "--preload + freeze + malloc_trim)\n")
    print("| setup | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name in names:
        cells = []
        for col in cols.values():
            s = col.get(name)
            if not s or "error" in s:
                cells.append("-" if not s else "failed")
                continue
            pre = col.get(PRELOAD, {}).get("total_pss")
            frz = col.get(FREEZE, {}).get("total_pss")
            tuned = col.get(TUNED, {}).get("total_pss")
            cells.append(f"{s['total_pss'] / 1024:.0f} ({fmt(pre and s['total_pss'] / pre, '.2f')} / "
                         f"{fmt(frz and s['total_pss'] / frz, '.2f')} / "
                         f"{fmt(tuned and s['total_pss'] / tuned, '.2f')})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    for python, col in cols.items():
        runs = {k: d for k, d in results.items() if k.partition(" @ ")[0] == python}
        for key, data in runs.items():
            print(f"\n{key}: refork at {', '.join(data['commits'])}; {data['versions']}")
            print(f"files: {', '.join(data['files'])}")
        print_summary(col, python)


# --------------------------------------------------------------------------- main


def versions(venv: Path) -> dict[str, str]:
    code = ("import importlib.metadata as md, json, sys\n"
            "out = {'python': sys.version.split()[0]}\n"
            "for n in ('refork', 'gunicorn', 'wagtail', 'django', 'whitenoise', 'pillow'):\n"
            "    out[n] = md.version(n)\n"
            "print(json.dumps(out))\n")
    return json.loads(subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                                     text=True, check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", help="X.Y: selects benchmarks/real_django/.venv-X.Y")
    parser.add_argument("--table", action="store_true",
                        help="print the newest result of each Python and exit")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--requests", type=int, default=600,
                        help="requests of the main load (then a quarter more, repeated while reforks go on)")
    parser.add_argument("--settle", type=int, default=600,
                        help="requests sent once the reforks are over, before the measurement")
    parser.add_argument("--clients", type=int, default=4, help="client threads, each logged in")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--refork-path", type=Path,
                        help="run refork from this checkout (PYTHONPATH; its extensions built for the "
                        "interpreter) instead of this one")
    parser.add_argument("--refork-commit", help="the commit --refork-path holds, if it is no git checkout")
    parser.add_argument("--only", help="comma-separated setups; default: " + ",".join(DEFAULT_ONLY))
    args = parser.parse_args()
    if args.table:
        print_table_all()
        return
    python = args.python or f"{sys.version_info[0]}.{sys.version_info[1]}"
    venv = venv_for(python)
    names = args.only.split(",") if args.only else DEFAULT_ONLY
    unknown = set(names) - set(GUNICORN_SETUPS) - set(REFORK_SETUPS)
    if unknown:
        sys.exit(f"unknown setup(s): {', '.join(sorted(unknown))}; choose from "
                 f"{', '.join([*GUNICORN_SETUPS, *REFORK_SETUPS])}")
    info = versions(venv)
    # The last commit that changed refork itself (the benchmark's own commits change no figure).
    commit = args.refork_commit or subprocess.run(
        ["git", "log", "-1", "--format=%h", "--", "refork", "native", "setup.py"],
        cwd=args.refork_path or HERE.parent.parent, capture_output=True, text=True,
    ).stdout.strip()
    print("versions:", ", ".join(f"{k} {v}" for k, v in info.items()), f"(refork at {commit})")
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    paths = site_paths(venv, python)
    print(f"paths: {len(paths['admin'])} admin, {len(paths['public'])} public, "
          f"{len(paths['static'])} static; {args.requests} requests + a quarter more (while reforks go "
          f"on) + {args.settle}, {args.clients} logged-in clients, {args.workers} workers")

    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        lineup = [server(n, venv, args.workers, paths, python, args.refork_path) for n in names]
        for srv in round_order(lineup, names, rnd):
            print(f"round {rnd + 1}/{args.rounds}: {srv.name} ...", end=" ", flush=True)
            res = bench_one(srv, args.workers, args.requests, args.settle, args.clients, paths, LOAD_SEED)
            runs[srv.name].append(res)
            print(res["error"] if "error" in res else describe(res), flush=True)
            for sample in res.get("load", {}).get("error_samples", []):
                print(f"    error: {sample}")
    summary = {n: summarize(runs[n]) for n in names}
    print_summary(summary, python)
    path = write_results(f"realdjango-py{python}-{commit}", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "python": python, "versions": info, "commit": commit,
        "argv": sys.argv[1:], "refork_path": args.refork_path and str(args.refork_path),
        "workers": args.workers, "requests": args.requests, "settle": args.settle, "clients": args.clients,
        "setups": {n: REFORK_SETUPS.get(n, "gunicorn") for n in names}, "summary": summary, "runs": runs,
    })
    print(f"results: {path}")


if __name__ == "__main__":
    main()
