"""HTTP/2 hello world (h2c, prior knowledge): refork (WSGI and ASGI) vs granian, gunicorn and
hypercorn, measured with h2load (nghttp2's load generator).

Every server runs 2 workers on 127.0.0.1 and speaks h2c; h2load opens 64 connections with up to
10 streams each in flight (`-c 64 -m 10`), so each connection multiplexes. Servers are interleaved
within each round, the order alternates, and the median over rounds is reported. p99 comes from
h2load's per-request log.

    python benchmarks/http2.py [--python 3.11] [--duration 10] [--rounds 3] [--only refork-wsgi] [--tls]

With --tls every server speaks h2 over TLS (ALPN) instead, with one self-signed certificate made
for the run (openssl); gunicorn and hypercorn are left out there.

refork is run from the checkout this script is in (PYTHONPATH), the peers from benchmarks/.venv-X.Y
(benchmarks/setup.sh installs hypercorn and Debian's nghttp2-client for h2load). refork runs with
`--refork-after off`: a refork ends the old workers' connections with GOAWAY, and h2load does not
open new ones, so the rest of the run would measure nothing.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    BENCH_DIR,
    ROOT,
    Server,
    announce,
    bench_parser,
    chosen,
    finish,
    fmt,
    median,
    print_table,
    rps_ratio,
    run_rounds,
    summarize,
    write_results,
)

APPS = BENCH_DIR / "apps"
CLIENTS, STREAMS = 64, 10


@dataclass
class H2Server(Server):
    """A Server that start() probes over HTTP/2 (granian --http 2 answers nothing else)."""

    scheme: str = "http"

    def status(self, path: str) -> int | None:
        cmd = ["h2load", "-n", "1", "-c", "1", f"{self.scheme}://127.0.0.1:{self.port}{path}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
        return 200 if re.search(r"status codes: 1 2xx", out) else None


def certificate(where: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key (PKCS#8, as granian wants)."""
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)  # fmt: skip
    return str(cert), str(key)


def servers(venv: Path, port: int, tls: tuple[str, str] | None = None) -> list[H2Server]:
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    protocols = "h2,h1" if tls else "h2c,h1"
    refork = [str(bin_ / "python"), "-m", "refork", "-w", "2", "--chdir", str(APPS), "-b", f"{bind}:{{port}}",
              "--http-protocols", protocols, "--refork-after", "off"]  # fmt: skip
    gunicorn = [str(bin_ / "gunicorn"), "-w", "2", "-b", f"{bind}:{{port}}", "--log-level", "warning",
                "--http-protocols", "h2,h1", "--http2-cleartext", "prior-knowledge"]  # fmt: skip
    granian = [str(bin_ / "granian"), "--workers", "2", "--host", bind, "--port", "{port}", "--no-ws",
               "--log-level", "warning", "--http", "2"]  # fmt: skip
    hypercorn = [str(bin_ / "hypercorn"), "--workers", "2", "--bind", f"{bind}:{{port}}",
                 "--log-level", "warning"]  # fmt: skip
    specs = [
        ("refork-wsgi", "wsgi", [*refork, "hello_wsgi:app"]),
        ("refork-wsgi-threads", "wsgi", [*refork, "--threads", "4", "hello_wsgi:app"]),
        ("refork-asgi", "asgi", [*refork, "--interface", "asgi", "hello_asgi:app"]),
        ("gunicorn-gthread", "wsgi", [*gunicorn, "-k", "gthread", "--threads", "4", "hello_wsgi:app"]),
        ("granian-wsgi", "wsgi", [*granian, "--interface", "wsgi", "hello_wsgi:app"]),
        ("granian-asgi", "asgi", [*granian, "--interface", "asgi", "hello_asgi:app"]),
        ("hypercorn-asgi", "asgi", [*hypercorn, "-k", "uvloop", "hello_asgi:app"]),
    ]
    if tls:
        cert, key = tls
        own = {"refork": ["--certfile", cert, "--keyfile", key],
               "granian": ["--ssl-certificate", cert, "--ssl-keyfile", key]}  # fmt: skip
        specs = [(name, iface, [*argv[:-1], *own[name.split("-")[0]], argv[-1]])
                 for name, iface, argv in specs if name.split("-")[0] in own]  # fmt: skip
    mine = {"PYTHONPATH": str(ROOT)}  # refork from this checkout
    return [
        H2Server(name, iface, [a.replace("{port}", str(port + i)) for a in argv], port + i, APPS,
                 env=mine if name.startswith("refork") else {},
                 scheme="https" if tls else "http")  # fmt: skip
        for i, (name, iface, argv) in enumerate(specs)
    ]


def run_h2load(port: int, duration: float, scheme: str = "http") -> dict:
    """h2load over h2c (or h2 over TLS) against 127.0.0.1:port for `duration` seconds (after a 1 s
    warm-up): req/s, p50/p99 ms from its per-request log, requests and failures."""
    with tempfile.NamedTemporaryFile(prefix="h2load-", suffix=".log") as log:
        cmd = ["h2load", "-c", str(CLIENTS), "-m", str(STREAMS), "-t", "2", "-D", f"{duration:g}",
               "--warm-up-time", "1", "--log-file", log.name, f"{scheme}://127.0.0.1:{port}/"]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + 60).stdout
        # the log: one line a request, "start (µs since the run began)\tstatus\tduration (µs)"
        times = sorted(int(line.split("\t")[2]) for line in Path(log.name).read_text().splitlines() if line)
    result: dict = {"rps": 0.0, "p50_ms": None, "p99_ms": None, "requests": 0, "errors": 0, "protocol": None}
    if m := re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out):
        result["rps"] = float(m.group(1))
    counts = r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored"
    if m := re.search(counts, out):
        result["requests"] = int(m.group(1))
        result["errors"] = int(m.group(2)) + int(m.group(3))
    if m := re.search(r"Application protocol: (\S+)", out):
        result["protocol"] = m.group(1)
    if times:
        result["p50_ms"] = times[len(times) // 2] / 1000
        result["p99_ms"] = times[min(len(times) - 1, int(len(times) * 0.99))] / 1000
    return result


def bench_one(server: H2Server, duration: float) -> dict:
    error = server.start()
    if error:
        server.stop()
        return {"error": error}
    probe = run_h2load(server.port, 1, server.scheme)
    want = "h2" if server.scheme == "https" else "h2c"
    if probe["protocol"] != want or not probe["requests"]:
        server.stop()
        got = f"protocol {probe['protocol']}, {probe['errors']} errors"
        return {"error": f"no {want} answers (h2load: {got})"}
    return finish(server, run_h2load(server.port, duration, server.scheme))


def line(res: dict) -> str:
    return f"{res['rps']:.0f} req/s, p99 {fmt(res['p99_ms'], '.2f')} ms, errors {res['errors']}"


def main() -> None:
    parser = bench_parser(__doc__, duration=10.0, port=19600)
    parser.add_argument("--tls", action="store_true", help="h2 over TLS (ALPN) instead of h2c")
    args = parser.parse_args()
    tls = certificate(Path(tempfile.mkdtemp(prefix="h2bench-"))) if args.tls else None
    if shutil.which("h2load") is None:
        raise SystemExit("h2load is missing: apt-get install nghttp2-client (benchmarks/setup.sh does)")
    venv, info = announce(args.python)
    wanted = chosen([s.name for s in servers(venv, args.port, tls)], args.only)
    runs, failed = run_rounds(
        args.rounds,
        lambda rnd: servers(venv, args.port + 20 * rnd, tls),
        wanted,
        lambda server: bench_one(server, args.duration),
        line,
    )
    ifaces = {s.name: s.interface for s in servers(venv, 0, tls)}

    def medians(rs: list[dict]) -> dict:
        return {"rps": median([r["rps"] for r in rs]), "p99_ms": median([r["p99_ms"] for r in rs]),
                "errors": sum(r["errors"] for r in rs)}  # fmt: skip

    summary = summarize(wanted, runs, failed, medians)
    kind = "h2 over TLS" if tls else "h2c"
    print(f"\nHTTP/2 ({kind}), median of {args.rounds} rounds, {args.duration:g}s each, h2load -c {CLIENTS} "
          f"-m {STREAMS} -t 2, 2 workers, Python {info.get('python')}")
    rows = []
    best_peer = {"wsgi": "granian-wsgi", "asgi": "granian-asgi"}
    for name, s in summary.items():
        iface = ifaces[name]
        if "error" in s:
            rows.append([name, iface, "-", "-", "-", "-", s["error"]])
            continue
        vs = fmt(rps_ratio(summary, name, best_peer[iface]), ".2f", "x") + f" vs {best_peer[iface]}"
        rows.append([name, iface, f"{s['rps']:.0f}", fmt(s["p99_ms"], ".2f"), vs, str(s["errors"]), ""])
    print_table(["server", "iface", "req/s", "p99 ms", "ratio", "errors", "note"], rows)
    print()
    pairs = (("refork-wsgi", "granian-wsgi"), ("refork-wsgi-threads", "gunicorn-gthread"),
             ("refork-asgi", "granian-asgi"), ("refork-asgi", "hypercorn-asgi"))  # fmt: skip
    for mine, peer in pairs:
        if mine in summary and peer in summary:
            print(f"{mine} / {peer}: {fmt(rps_ratio(summary, mine, peer), '.2f', 'x')}")
    path = write_results("http2-tls" if tls else "http2", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "duration": args.duration,
        "rounds": args.rounds, "clients": CLIENTS, "streams": STREAMS, "summary": summary, "runs": runs,
    })  # fmt: skip
    print(f"results: {path}")


if __name__ == "__main__":
    main()
