"""TLS hello world: refork (WSGI and ASGI) vs granian, uvicorn and gunicorn, all terminating TLS (issue 10).

refork-*-plain rows run the same refork without TLS (plain HTTP) in the same rounds: the cost of TLS.

Every server runs 2 workers on 127.0.0.1 with the same ECDSA P-256 certificate (made here with
the openssl command), TLS 1.3 as the client (wrk's OpenSSL) negotiates it. wrk keeps its 64
connections alive, so this measures encrypted request/response throughput, with one handshake per
connection at the start. Servers are interleaved within each round, the order alternates, and the
median over rounds is reported.

    python benchmarks/tls.py [--python 3.11] [--duration 10] [--rounds 3] [--only refork-wsgi,uvicorn]

refork is run from the checkout this script is in (PYTHONPATH), the peers from benchmarks/.venv-X.Y
(benchmarks/setup.sh).
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import (
    BENCH_DIR,
    ROOT,
    Server,
    fmt,
    median,
    print_table,
    run_wrk,
    tree,
    venv_dir,
    versions,
    write_results,
)

APPS = BENCH_DIR / "apps"
BASELINE = {"wsgi": "gunicorn-gthread", "asgi": "uvicorn"}


def make_certificate(where: Path) -> tuple[Path, Path]:
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def https_status(port: int, timeout: float = 2.0) -> int | None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)
        conn.request("GET", "/")
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except (OSError, http.client.HTTPException):
        return None


@dataclass
class TlsServer(Server):
    """A Server that answers over HTTPS (common.Server.start polls plain HTTP); tls=False: plain."""

    tls: bool = True

    def start(self, timeout: float = 60.0, path: str = "/") -> str | None:
        if not self.tls:
            return super().start(timeout, path)
        fd, name = tempfile.mkstemp(prefix=f"bench-{self.name}-", suffix=".stderr")
        self.stderr_path = Path(name)
        with os.fdopen(fd, "wb") as err:
            self.proc = subprocess.Popen(
                self.argv, cwd=self.cwd, env={**os.environ, **self.env}, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"failed to start: {self.first_stderr_line()}"
            if https_status(self.port) == 200:
                self.seen.update(tree(self.proc.pid))
                return None
            time.sleep(0.2)
        self.stop()
        return f"failed to start (no answer in {timeout:.0f}s): {self.first_stderr_line()}"


def servers(venv: Path, port: int, cert: Path, key: Path) -> list[TlsServer]:
    bin_ = venv / "bin"
    bind = "127.0.0.1"
    refork = [str(bin_ / "python"), "-m", "refork", "-w", "2", "--chdir", str(APPS), "-b", f"{bind}:{{port}}",
              "--certfile", str(cert), "--keyfile", str(key)]  # fmt: skip
    gunicorn = [str(bin_ / "gunicorn"), "-w", "2", "-b", f"{bind}:{{port}}", "--log-level", "warning",
                "--certfile", str(cert), "--keyfile", str(key)]  # fmt: skip
    uvicorn = [str(bin_ / "uvicorn"), "--workers", "2", "--http", "httptools", "--loop", "uvloop",
               "--no-access-log", "--log-level", "warning", "--host", bind, "--port", "{port}",
               "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]  # fmt: skip
    granian = [str(bin_ / "granian"), "--workers", "2", "--host", bind, "--port", "{port}", "--no-ws",
               "--log-level", "warning", "--ssl-certificate", str(cert),
               "--ssl-keyfile", str(key)]  # fmt: skip
    specs = [
        ("refork-wsgi", "wsgi", [*refork, "hello_wsgi:app"]),
        ("refork-wsgi-threads", "wsgi", [*refork, "--threads", "4", "hello_wsgi:app"]),
        ("refork-asgi", "asgi", [*refork, "--interface", "asgi", "hello_asgi:app"]),
        ("refork-wsgi-plain", "wsgi", [*refork[:-4], "hello_wsgi:app"]),
        ("refork-asgi-plain", "asgi", [*refork[:-4], "--interface", "asgi", "hello_asgi:app"]),
        ("gunicorn-gthread", "wsgi", [*gunicorn, "-k", "gthread", "--threads", "4", "hello_wsgi:app"]),
        ("uvicorn", "asgi", [*uvicorn, "hello_asgi:app"]),
        ("granian-wsgi", "wsgi", [*granian, "--interface", "wsgi", "hello_wsgi:app"]),
        ("granian-asgi", "asgi", [*granian, "--interface", "asgi", "hello_asgi:app"]),
    ]
    mine = {"PYTHONPATH": str(ROOT)}  # refork from this checkout
    return [
        TlsServer(name, iface, [a.replace("{port}", str(port + i)) for a in argv], port + i, APPS,
                  env=mine if name.startswith("refork") else {}, tls=not name.endswith("-plain"))  # fmt: skip
        for i, (name, iface, argv) in enumerate(specs)
    ]


def bench_one(server: TlsServer, duration: float) -> dict:
    error = server.start()
    if error:
        server.stop()
        return {"error": error}
    scheme = "https" if server.tls else "http"
    run_wrk(server.port, 2, scheme=scheme)
    result = run_wrk(server.port, duration, scheme=scheme)
    leaked = server.stop()
    if leaked:
        result["leaked_pids"] = leaked
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", help="interpreter version or path; selects benchmarks/.venv-X.Y")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of measured load per server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma-separated server names")
    parser.add_argument("--port", type=int, default=19400, help="first port; each round uses a fresh range")
    args = parser.parse_args()

    venv = venv_dir(args.python)
    info = versions(venv)
    info["openssl"] = ssl.OPENSSL_VERSION
    print("versions:", ", ".join(f"{k} {v}" for k, v in info.items()))
    with tempfile.TemporaryDirectory(prefix="refork-tls-bench-") as tmp:
        cert, key = make_certificate(Path(tmp))
        names = [s.name for s in servers(venv, args.port, cert, key)]
        wanted = args.only.split(",") if args.only else names
        unknown = set(wanted) - set(names)
        if unknown:
            sys.exit(f"unknown server(s): {', '.join(sorted(unknown))}; choose from {', '.join(names)}")
        runs: dict[str, list[dict]] = {n: [] for n in wanted}
        failed: dict[str, str] = {}
        for rnd in range(args.rounds):
            order = [s for s in servers(venv, args.port + 20 * rnd, cert, key) if s.name in wanted]
            if rnd % 2:
                order.reverse()
            for server in order:
                if server.name in failed:
                    continue
                print(f"round {rnd + 1}/{args.rounds}: {server.name} ...", end=" ", flush=True)
                res = bench_one(server, args.duration)
                if "error" in res:
                    failed[server.name] = res["error"]
                    print(res["error"])
                    continue
                runs[server.name].append(res)
                print(f"{res['rps']:.0f} req/s, p99 {fmt(res['p99_ms'], '.2f')} ms, errors {res['errors']}")
        ifaces = {s.name: s.interface for s in servers(venv, 0, cert, key)}

    summary: dict[str, dict] = {}
    for name in wanted:
        if name in failed:
            summary[name] = {"interface": ifaces[name], "error": failed[name]}
        else:
            summary[name] = {
                "interface": ifaces[name],
                "rps": median([r["rps"] for r in runs[name]]),
                "p99_ms": median([r["p99_ms"] for r in runs[name]]),
                "errors": sum(r["errors"] + r["non2xx"] for r in runs[name]),
            }

    def ratio(name: str, other: str) -> float | None:
        mine, ref = summary[name].get("rps"), summary.get(other, {}).get("rps")
        return mine / ref if mine and ref else None

    print(f"\nTLS, median of {args.rounds} rounds, {args.duration:g}s each, wrk -t2 -c64 keep-alive over "
          f"https, 2 workers, Python {info.get('python')}, {info['openssl']}")
    rows = []
    for name, s in summary.items():
        base = BASELINE[s["interface"]]
        if "error" in s:
            rows.append([name, s["interface"], "-", "-", "-", "-", s["error"]])
        else:
            vs = fmt(ratio(name, base), ".2f", "x") + f" vs {base}"
            rows.append([name, s["interface"], f"{s['rps']:.0f}", fmt(s["p99_ms"], ".2f"), vs,
                         str(s["errors"]), ""])  # fmt: skip
    print_table(["server", "iface", "req/s", "p99 ms", "ratio", "errors", "note"], rows)
    print()
    pairs = (("refork-wsgi", "granian-wsgi"), ("refork-asgi", "granian-asgi"), ("refork-asgi", "uvicorn"),
             ("refork-wsgi", "refork-wsgi-plain"), ("refork-asgi", "refork-asgi-plain"))
    for mine, peer in pairs:
        if mine in summary and peer in summary:
            print(f"{mine} / {peer}: {fmt(ratio(mine, peer), '.2f', 'x')}")

    path = write_results("tls", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "duration": args.duration,
        "rounds": args.rounds, "runs": runs, "summary": summary,
    })  # fmt: skip
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
