"""Instructions per request in a refork worker, counted by valgrind's callgrind: this tree vs another.

Throughput on a shared 2-core machine moves by 10-20% from round to round; an instruction count
does not. The server runs under `valgrind --tool=callgrind` with one worker; one keep-alive client
sends N1, then (in a second run) N2 requests; the worker's count difference over N2 - N1 is the cost
of one request, start-up and shut-down cancelled out. Used to check that a refactor kept the
request path as cheap as before (`--base` = a checkout of the commit before).

    python benchmarks/instructions.py --base /tmp/base [--python 3.11] [--requests 2000,12000]
        [--interfaces wsgi,wsgi-pool,asgi]

wsgi is one app thread (the native engine when the extension is built), wsgi-pool is --threads 4
(the pool engine), asgi the asyncio loop.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common import BENCH_DIR, free_port, print_table, script_parser, venv_dir

APPS = BENCH_DIR / "apps"
REQUEST = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"
BODY = b"Hello, world!"
POOL = ("wsgi", ("--threads", "4"))  # --interfaces wsgi-pool: the pool engine


def send_requests(port: int, count: int, timeout: float = 600.0) -> None:
    """One keep-alive connection, one request at a time (the server is slow under valgrind)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    buf = b""
    with sock:
        for _ in range(count):
            sock.sendall(REQUEST)
            while BODY not in buf:
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError("server closed the connection")
                buf += chunk
            buf = buf.split(BODY, 1)[1]


def worker_instructions(
    python: Path,
    tree: Path | None,
    interface: str,
    count: int,
    extra: Sequence[str] = (),
    send: Callable[[int, int], None] = send_requests,
) -> int:
    """Run refork -w 1 (and `extra` arguments) under callgrind, `send(port, count)` requests
    (default: one keep-alive connection), return the worker's instruction total."""
    out = Path(tempfile.mkdtemp(prefix="refork-callgrind-"))
    port = free_port()
    app = "hello_asgi:app" if interface == "asgi" else "hello_wsgi:app"
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree else dict(os.environ)
    cmd = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/out.%p",
        str(python), "-m", "refork", "-w", "1", "--control-socket", "off", "--chdir", str(APPS),
        "-b", f"127.0.0.1:{port}", "--interface", interface, "--refork-after", "off", *extra, app,
    ]  # fmt: skip  (no refork: a worker promoted to mold would close the client's connection)
    proc = subprocess.Popen(cmd, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        send(port, count)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    totals = {}
    for path in out.glob("out.*"):
        text = path.read_text(errors="replace")
        line = next(ln for ln in text.splitlines() if ln.startswith(("summary:", "totals:")))
        totals[int(path.name.split(".")[1])] = int(line.split()[1])
    return totals[max(totals)]  # the worker is the last process forked


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--base", type=Path, required=True, help="another refork checkout (extension built)")
    parser.add_argument("--requests", default="2000,12000", help="the two request counts N1,N2")
    parser.add_argument("--interfaces", default="wsgi,wsgi-pool,asgi")
    args = parser.parse_args()
    python = venv_dir(args.python) / "bin" / "python"
    n1, n2 = (int(n) for n in args.requests.split(","))
    rows = []
    for interface in args.interfaces.split(","):
        per_request = {}
        kind, extra = POOL if interface == "wsgi-pool" else (interface, ())
        for name, tree in (("this tree", None), ("base", args.base.resolve())):
            low = worker_instructions(python, tree, kind, n1, extra)
            high = worker_instructions(python, tree, kind, n2, extra)
            per_request[name] = (high - low) / (n2 - n1)
            print(f"{interface} {name}: {per_request[name]:,.0f} instructions per request", flush=True)
        ratio = per_request["this tree"] / per_request["base"]
        mine, old = per_request["this tree"], per_request["base"]
        rows.append([interface, f"{mine:,.0f}", f"{old:,.0f}", f"{ratio:.4f}"])
    print()
    print_table(["interface", "this tree", "base", "ratio"], rows)


if __name__ == "__main__":
    sys.exit(main())
