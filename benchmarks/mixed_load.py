"""Mixed load through reforks: refork with its defaults (so `--refork-after` reforks early, workers
retire and molds are promoted during the run) and `-w 2`, on each request path of
tests/support/request_paths.py in turn, under a mixed load for --duration seconds: keep-alive GETs
(3 threads), 1 MB uploads (1), slow streaming responses (2: 10 chunks 0.1 s apart) and, on the ASGI
paths, 20 WebSockets echoing a message every second (over HTTP/1.1; TLS on the TLS path). On the
HTTP/2 paths the requests speak HTTP/2 (the tests' H2Client). The load is tests/support/mixed_load.py,
the app tests/apps/mixed_load.py; refork runs from this checkout with this interpreter.

One row per path: requests served, failed requests by kind, WebSocket closes by code, reforks (the
molds promoted, from the log); then the examples of each failure and where each server's log is.

    python benchmarks/mixed_load.py [--duration 60] [--only engine,uvloop] [--port 19900] [--keep-logs DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))  # the load (support.mixed_load) and the paths

from support.mixed_load import MixedLoad  # noqa: E402
from support.request_paths import PATHS, flags, http2, tls  # noqa: E402

WEBSOCKETS = 20


def wait_ready(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited ({proc.returncode})")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("the server did not listen in time")


def run_path(path: str, port: int, duration: float, logs: Path) -> tuple[MixedLoad, int, str]:
    """(the load, the molds promoted, the log's path) of one path's run."""
    path_flags, app = flags(path, "apps.mixed_load")
    log_path = logs / f"{path}.log"
    cmd = [sys.executable, "-m", "refork", "-b", f"127.0.0.1:{port}", "-w", "2", "--chdir", str(TESTS),
           "--control-socket", str(logs / f"{path}.ctl"), *path_flags, app]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        try:
            wait_ready(port, proc)
            ws = WEBSOCKETS if PATHS[path][0] == "asgi" else 0
            load = MixedLoad(port, http2=http2(path), tls=tls(path), ws_tls=tls(path, "http/1.1"),
                             websockets=ws)  # fmt: skip
            with load:
                time.sleep(duration)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    text = log_path.read_text(errors="replace")
    generations = {int(g) for g in re.findall(r"mold \(gen (\d+)\) ready", text)}
    promoted = len(generations - {0})  # (generation 0: the first mold)
    return load, promoted, str(log_path)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--duration", type=float, default=60, help="seconds of load per path")
    parser.add_argument("--only", help="comma-separated paths (default: every path)")
    parser.add_argument("--port", type=int, default=19900, help="the first path's port (then one more each)")
    parser.add_argument("--keep-logs", type=Path, help="write the servers' logs here (default: a temp dir)")
    args = parser.parse_args()
    paths = args.only.split(",") if args.only else list(PATHS)
    logs = args.keep_logs or Path(tempfile.mkdtemp(prefix="refork-mixed-"))
    logs.mkdir(parents=True, exist_ok=True)
    print("command:", " ".join(["python", *sys.argv]), f"(Python {sys.version.split()[0]})")
    print("| path | served (get/upload/stream) | retried | failed | WebSocket msgs | WS closes | reforks |")
    print("|---|---|---|---|---|---|---|")
    details = []
    for i, path in enumerate(paths):
        load, promoted, log_path = run_path(path, args.port + i, args.duration, logs)
        ok = "/".join(str(load.ok[k]) for k in ("get", "upload", "stream"))
        failed = ", ".join(f"{k} x{v}" for k, v in sorted(load.failures.items())) or "0"
        closes = ", ".join(f"{k} x{v}" for k, v in sorted(load.ws_closes.items())) or "0"
        ws = str(load.ws_messages) if PATHS[path][0] == "asgi" else "-"
        print(f"| {path} | {ok} | {load.retried} | {failed} | {ws} | {closes} | {promoted} |", flush=True)
        details += [f"{path} ({log_path}): {key}: {ex}" for key, exs in load.examples.items() for ex in exs]
    for line in details:
        print(line)


if __name__ == "__main__":
    main()
