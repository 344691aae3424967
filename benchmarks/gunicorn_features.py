"""What gunicorn's optional features cost a request: access-log formats, StatsD, the PROXY protocol.

Instructions per request of the worker, counted by callgrind (deterministic on a busy machine; see
benchmarks/instructions.py): one worker serves benchmarks/apps/hello_wsgi.py; the worker's count
over N2 - N1 requests is the cost of one. Each variant adds its flags to a base:

- access log (native engine, keep-alive, the log written to /dev/null): `common` against gunicorn's
  default format (the target: within 5% of `common`);
- StatsD (`--statsd-host` at a port where nothing listens: what a worker records; the monitor's
  sends are not the request's): the native engine and the Python loop, with and without;
- PROXY protocol, a new connection per request (the cost lands once per connection): without a
  header, with a v1 header read by the native engine in Rust, and the same on the Python loop
  (what handing such connections to Python would cost their first request).

`--wrk` also measures req/s of the access-log variants with `wrk -t2 -c64` (keep-alive, the
variants interleaved over rounds, medians).

    python benchmarks/gunicorn_features.py [--python 3.11] [--requests 2000,12000] [--only a,b]
        [--tree CHECKOUT] [--wrk [--no-callgrind] --duration 10 --rounds 3]
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common import (
    BENCH_DIR,
    Server,
    announce,
    bench_parser,
    chosen,
    finish,
    median,
    print_table,
    refork_cmd,
    run_rounds,
    run_wrk,
)
from instructions import BODY, send_requests, worker_instructions

APPS = BENCH_DIR / "apps"
GUNICORN_DEFAULT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'
NATIVE = ["--wsgi-loop", "native"]
PYTHON = ["--wsgi-loop", "python"]
LOG = ["--access-logfile", "/dev/null", "--access-logformat"]
STATSD = ["--statsd-host", "127.0.0.1:9"]  # the discard port: nothing listens, nothing waits
PROXY_LINE = b"PROXY TCP4 192.0.2.7 127.0.0.1 51234 8000\r\n"


def send_connections(header: bytes) -> Callable[[int, int], None]:
    """A new connection per request, each starting with `header` (b"": none)."""

    def send(port: int, count: int) -> None:
        send_requests(port, 1)  # (waits for the server to listen)
        for _ in range(count - 1):
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(header + b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                data = b""
                while BODY not in data:
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise RuntimeError("server closed the connection")
                    data += chunk

    return send


PROXY = ["--proxy-protocol", "v1"]
KEEP_ALIVE, CONNS, PROXIED = send_requests, send_connections(b""), send_connections(PROXY_LINE)

# name -> (group, flags, how requests are sent, the variant it is compared with)
VARIANTS: dict[str, tuple[str, list[str], Callable[[int, int], None], str | None]] = {
    "native": ("base", NATIVE, KEEP_ALIVE, None),
    "native+common": ("access log", [*NATIVE, *LOG, "common"], KEEP_ALIVE, "native"),
    "native+gunicorn-format": ("access log", [*NATIVE, *LOG, GUNICORN_DEFAULT], KEEP_ALIVE, "native+common"),
    "native+statsd": ("statsd", [*NATIVE, *STATSD], KEEP_ALIVE, "native"),
    "python": ("base", PYTHON, KEEP_ALIVE, None),
    "python+statsd": ("statsd", [*PYTHON, *STATSD], KEEP_ALIVE, "python"),
    "native-conn": ("proxy", NATIVE, CONNS, None),
    "native-conn+proxy": ("proxy", [*NATIVE, *PROXY], PROXIED, "native-conn"),
    "python-conn+proxy": ("proxy", [*PYTHON, *PROXY], PROXIED, "native-conn"),
}


def instructions(python: Path, tree: Path | None, names: list[str], n1: int, n2: int) -> dict[str, float]:
    per_request = {}
    for name in names:
        _, flags, send, _ = VARIANTS[name]
        low = worker_instructions(python, tree, "wsgi", n1, flags, send)
        high = worker_instructions(python, tree, "wsgi", n2, flags, send)
        per_request[name] = (high - low) / (n2 - n1)
        print(f"{name}: {per_request[name]:,.0f} instructions per request", flush=True)
    return per_request


def wrk_lineup(venv: Path, port: int, tree: Path | None) -> list[Server]:
    servers = []
    for i, name in enumerate(n for n in VARIANTS if n.startswith("native") and "conn" not in n):
        argv = [*refork_cmd(venv), "-w", "1", "--control-socket", "off", "--chdir", str(APPS),
                "-b", f"127.0.0.1:{port + i}", *VARIANTS[name][1], "hello_wsgi:app"]  # fmt: skip
        env = {"PYTHONPATH": str(tree)} if tree else {}
        servers.append(Server(name, "wsgi", argv, port + i, APPS, env=env))
    return servers


def main() -> None:
    parser = bench_parser(__doc__, duration=10.0, port=19700)
    parser.add_argument("--requests", default="2000,12000", help="callgrind's two request counts N1,N2")
    parser.add_argument("--wrk", action="store_true", help="also req/s of the access-log variants")
    parser.add_argument("--no-callgrind", action="store_true", help="only the wrk run")
    parser.add_argument("--tree", type=Path, help="run refork from this checkout (PYTHONPATH)")
    args = parser.parse_args()
    venv, info = announce(args.python, command=True)
    names = chosen(list(VARIANTS), args.only)
    n1, n2 = (int(n) for n in args.requests.split(","))
    if not args.no_callgrind:
        counts = instructions(venv / "bin" / "python", args.tree, names, n1, n2)
        rows = []
        for name in names:
            group, _, _, base = VARIANTS[name]
            ratio = counts[name] / counts[base] if base in counts else None
            rows.append([group, name, f"{counts[name]:,.0f}", base or "-", f"{ratio:.4f}" if ratio else "-"])
        print(f"\nworker instructions per request, 1 worker, Python {info.get('python')}")
        print_table(["group", "variant", "instructions/req", "vs", "ratio"], rows)
    if args.wrk:

        def measure(server: Server) -> dict:
            if error := server.start():
                server.stop()
                return {"error": error}
            run_wrk(server.port, 2)
            return finish(server, run_wrk(server.port, args.duration))

        def lineup(rnd: int) -> list[Server]:
            return wrk_lineup(venv, args.port + 10 * rnd, args.tree)

        wanted = [s.name for s in lineup(0)]
        runs, _ = run_rounds(args.rounds, lineup, wanted, measure, lambda r: f"{r['rps']:.0f} req/s")
        rps = {name: median([r["rps"] for r in rs]) for name, rs in runs.items() if rs}
        print(f"\nwrk -t2 -c64 keep-alive, median of {args.rounds} rounds ({time.strftime('%Y-%m-%d')})")
        print_table(["variant", "req/s", "vs native+common"],
                    [[n, f"{r:.0f}", f"{r / rps['native+common']:.3f}" if "native+common" in rps else "-"]
                     for n, r in rps.items()])  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
