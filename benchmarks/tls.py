"""TLS hello world: refork (WSGI and ASGI) vs granian, uvicorn and gunicorn, all terminating TLS.

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

import ssl
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
    http_get,
    print_wrk_table,
    rps_ratio,
    run_rounds,
    run_wrk,
    write_results,
    wrk_line,
    wrk_summary,
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


def insecure_context() -> ssl.SSLContext:
    """A client context that takes the self-signed certificate."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass
class TlsServer(Server):
    """A Server that answers over HTTPS, so start() waits for a TLS answer; tls=False: plain HTTP."""

    tls: bool = True

    def status(self, path: str) -> int | None:
        if not self.tls:
            return super().status(path)
        return http_get(self.port, path, timeout=2.0, context=insecure_context())


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
    return finish(server, run_wrk(server.port, duration, scheme=scheme))


def main() -> None:
    args = bench_parser(__doc__, duration=10.0, port=19400).parse_args()

    venv, info = announce(args.python, openssl=ssl.OPENSSL_VERSION)
    with tempfile.TemporaryDirectory(prefix="refork-tls-bench-") as tmp:
        cert, key = make_certificate(Path(tmp))
        wanted = chosen([s.name for s in servers(venv, args.port, cert, key)], args.only)
        runs, failed = run_rounds(
            args.rounds,
            lambda rnd: servers(venv, args.port + 20 * rnd, cert, key),
            wanted,
            lambda server: bench_one(server, args.duration),
            wrk_line,
        )
        ifaces = {s.name: s.interface for s in servers(venv, 0, cert, key)}
    summary = wrk_summary(wanted, runs, failed, ifaces)

    print(f"\nTLS, median of {args.rounds} rounds, {args.duration:g}s each, wrk -t2 -c64 keep-alive over "
          f"https, 2 workers, Python {info.get('python')}, {info['openssl']}")
    print_wrk_table(summary, BASELINE)
    print()
    pairs = (("refork-wsgi", "granian-wsgi"), ("refork-asgi", "granian-asgi"), ("refork-asgi", "uvicorn"),
             ("refork-wsgi", "refork-wsgi-plain"), ("refork-asgi", "refork-asgi-plain"))
    for mine, peer in pairs:
        if mine in summary and peer in summary:
            print(f"{mine} / {peer}: {fmt(rps_ratio(summary, mine, peer), '.2f', 'x')}")

    path = write_results("tls", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "duration": args.duration,
        "rounds": args.rounds, "runs": runs, "summary": summary,
    })  # fmt: skip
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
