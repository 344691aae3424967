"""Static files: refork's --static mount against WhiteNoise, granian's mount and nginx.

Two assets, made fresh in a temporary directory: `small.css` (2 KB) and `big.js` (60 KB), served
at /static/ by every server with 2 workers on 127.0.0.1:

    refork-native        refork --wsgi-loop native --static /static=DIR hello_wsgi:app
    refork-pool          refork --wsgi-loop native --threads 4 --static /static=DIR hello_wsgi:app
    refork-uvloop        refork --interface asgi --loop uvloop --static /static=DIR hello_asgi:app
    whitenoise-refork    refork --wsgi-loop native whitenoise_wsgi:app (WhiteNoise around hello_wsgi)
    whitenoise-gunicorn  gunicorn -k gthread --threads 4 whitenoise_wsgi:app
    granian-mount        granian --interface wsgi --static-path-mount DIR hello_wsgi:app
    nginx                worker_processes 2, sendfile on, access_log off, keepalive_requests 1000000

In each round every server is started once, each asset is checked (200, its exact size), warmed
up 1 s and measured with `wrk -t2 -c64 -d<D>s --latency` (keep-alive); the order alternates
between rounds and the medians over rounds are printed with ratios against nginx and against
WhiteNoise under gunicorn (the issue's targets for the mount: >= 1.0x nginx, >= 5x
whitenoise-gunicorn).

CPU per request: utime + stime of every process of the server's tree (all threads, reaped
children included; /proc/PID/stat), read right before and right after the measured run, divided
by the requests wrk counted.

    python3 benchmarks/static_files.py [--python 3.11] [--duration 5] [--rounds 3] [--only nginx,...]

refork runs from the checkout this script is in (PYTHONPATH), the peers from benchmarks/.venv-X.Y
(benchmarks/setup.sh: gunicorn, granian, whitenoise; Debian's nginx).
"""

from __future__ import annotations

import http.client
import os
import shutil
import subprocess
import tempfile
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
    run_rounds,
    run_wrk,
    summarize,
    venv_dir,
    write_results,
)

APPS = BENCH_DIR / "apps"
ASSETS = {"2k": ("small.css", 2048), "60k": ("big.js", 60 * 1024)}
MINE = ("refork-native", "refork-pool", "refork-uvloop")
TARGETS = [("nginx", 1.0), ("whitenoise-gunicorn", 5.0)]

NGINX_CONF = """\
worker_processes 2;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    include /etc/nginx/mime.types;
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 1000000;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location /static/ {{ alias {root}/; }}
    }}
}}
"""


def nginx_version() -> str:
    if shutil.which("nginx") is None:
        return "(not installed)"
    out = subprocess.run(["nginx", "-v"], capture_output=True, text=True)
    return (out.stderr or out.stdout).strip().rpartition("/")[2]


def whitenoise_version(venv: Path) -> str:
    code = "import importlib.metadata as md; print(md.version('whitenoise'))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True)
    return out.stdout.strip() or "(not installed)"


def make_assets(root: Path) -> None:
    """The two files, of text-like bytes (the size is what matters)."""
    for name, size in ASSETS.values():
        line = b"/* refork static benchmark */ .a { color: #123456; }\n"
        (root / name).write_bytes((line * (size // len(line) + 1))[:size])


def servers(venv: Path, port: int, tmp: Path) -> list[Server]:
    """All contenders, in run order, on ports port, port+1, ..."""
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    root = tmp / "static"
    mount = ["--static", f"/static={root}"]
    refork = [str(bin_ / "python"), "-m", "refork", "-w", "2", "--chdir", str(APPS), "-b", f"{bind}:{{port}}"]
    gunicorn = [str(bin_ / "gunicorn"), "-w", "2", "-b", f"{bind}:{{port}}", "--log-level", "warning",
                "--chdir", str(APPS)]  # fmt: skip
    granian = [str(bin_ / "granian"), "--workers", "2", "--host", bind, "--port", "{port}", "--no-ws",
               "--log-level", "warning", "--interface", "wsgi", "--working-dir", str(APPS)]  # fmt: skip
    specs = [
        ("refork-native", [*refork, "--wsgi-loop", "native", *mount, "hello_wsgi:app"]),
        ("refork-pool", [*refork, "--wsgi-loop", "native", "--threads", "4", *mount, "hello_wsgi:app"]),
        ("refork-uvloop", [*refork, "--interface", "asgi", "--loop", "uvloop", *mount, "hello_asgi:app"]),
        ("whitenoise-refork", [*refork, "--wsgi-loop", "native", "whitenoise_wsgi:app"]),
        ("whitenoise-gunicorn", [*gunicorn, "-k", "gthread", "--threads", "4", "whitenoise_wsgi:app"]),
        (
            "granian-mount",
            [*granian, "--static-path-mount", str(root), "--static-path-route", "/static", "hello_wsgi:app"],
        ),  # fmt: skip
        (
            "nginx",
            ["nginx", "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(tmp / "nginx-{port}.conf")],
        ),  # fmt: skip
    ]
    env = {"PYTHONPATH": str(ROOT), "STATIC_BENCH_DIR": str(root)}
    lineup = []
    for i, (name, argv) in enumerate(specs):
        p = port + i
        if name == "nginx":
            (tmp / f"nginx-{p}.conf").write_text(NGINX_CONF.format(tmp=tmp, port=p, root=root))
        lineup.append(Server(name, "static", [a.replace("{port}", str(p)) for a in argv], p, APPS, env=env))
    return lineup


def body_length(port: int, path: str) -> int | None:
    """The length of GET path's 200 body, None on another status or no answer."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
    except (OSError, http.client.HTTPException):
        return None
    return len(body) if resp.status == 200 else None


def bench_one(server: Server, duration: float) -> dict:
    """Start; for each asset: check it, warm up 1 s, measure with CPU readings; stop."""
    first = f"/static/{ASSETS['2k'][0]}"
    error = server.start(path=first)
    if error:
        server.stop()
        return {"error": error}
    result: dict = {}
    for asset, (name, size) in ASSETS.items():
        path = f"/static/{name}"
        got = body_length(server.port, path)
        if got != size:
            server.stop()
            return {"error": f"GET {path}: {got} bytes, not {size}"}
        run_wrk(server.port, 1, path=path)
        before = cpu_seconds(server.pids())
        res = run_wrk(server.port, duration, path=path)
        user, system = cpu_delta(before, cpu_seconds(server.pids()))
        res["cpu_s"] = user + system
        res["cpu_us_per_req"] = (user + system) / res["requests"] * 1e6 if res["requests"] else None
        result[asset] = res
    return finish(server, result)


def describe(res: dict) -> str:
    return "; ".join(
        f"{asset}: {r['rps']:.0f} req/s, {fmt(r['cpu_us_per_req'], '.0f')} us CPU/req, p99 "
        f"{fmt(r['p99_ms'], '.2f')} ms, errors {r['errors'] + r['non2xx']}"
        for asset, r in res.items()
        if asset in ASSETS
    )


def medians(runs: list[dict]) -> dict:
    return {
        asset: {
            "rps": median([r[asset]["rps"] for r in runs]),
            "rps_rounds": [r[asset]["rps"] for r in runs],
            "cpu_us_per_req": median([r[asset]["cpu_us_per_req"] for r in runs]),
            "p99_ms": median([r[asset]["p99_ms"] for r in runs]),
            "errors": sum(r[asset]["errors"] + r[asset]["non2xx"] for r in runs),
        }
        for asset in ASSETS
    }


def ratio(summary: dict, name: str, ref: str, asset: str) -> float | None:
    mine = summary.get(name, {}).get(asset, {}).get("rps")
    theirs = summary.get(ref, {}).get(asset, {}).get("rps")
    return mine / theirs if mine and theirs else None


def print_summary(summary: dict) -> dict:
    """The table, then each target's ratio per asset; returns the checks."""
    rows = []
    for name, s in summary.items():
        if "error" in s:
            rows.append([name, "-", "-", "-", "-", "-", s["error"]])
            continue
        for asset in ASSETS:
            a = s[asset]
            rounds = " ".join(f"{v:.0f}" for v in a["rps_rounds"])
            rows.append([name, asset, f"{a['rps']:.0f}", rounds, fmt(a["cpu_us_per_req"], ".1f"),
                         fmt(a["p99_ms"], ".2f"), str(a["errors"])])  # fmt: skip
    print_table(["server", "asset", "req/s", "rounds", "CPU us/req", "p99 ms", "errors"], rows)
    checks = {}
    print()
    for name in MINE:
        for ref, target in TARGETS:
            for asset in ASSETS:
                r = ratio(summary, name, ref, asset)
                if r is None:
                    continue
                ok = r >= target
                checks[f"{name} {asset} vs {ref}"] = {"target": target, "ratio": r, "pass": ok}
                print(f"[{'PASS' if ok else 'FAIL'}] {name} {asset} >= {target:.1f}x {ref}: {r:.2f}x")
    return checks


def main() -> None:
    args = bench_parser(__doc__, duration=5.0, port=19800).parse_args()
    venv = venv_dir(args.python)
    venv, info = announce(args.python, command=True, nginx=nginx_version(),
                          whitenoise=whitenoise_version(venv))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="refork-static-bench-") as name:
        tmp = Path(name)
        os.chmod(tmp, 0o755)  # nginx's workers run as another user
        (tmp / "static").mkdir()
        make_assets(tmp / "static")
        wanted = chosen([s.name for s in servers(venv, args.port, tmp)], args.only)
        runs, failed = run_rounds(
            args.rounds,
            lambda rnd: servers(venv, args.port + 10 * rnd, tmp),
            wanted,
            lambda server: bench_one(server, args.duration),
            describe,
        )
    summary = summarize(wanted, runs, failed, medians)
    print(f"\nmedian of {args.rounds} rounds, {args.duration:g}s per asset, wrk -t2 -c64 keep-alive, "
          f"2 workers, Python {info.get('python')}")  # fmt: skip
    checks = print_summary(summary)
    path = write_results("static-files", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "duration": args.duration,
        "rounds": args.rounds, "runs": runs, "summary": summary, "checks": checks,
    })  # fmt: skip
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
