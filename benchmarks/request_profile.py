"""Where a hello-world request goes: refork's native engines against bjoern (WSGI), refork's ASGI
protocol against uvicorn (ASGI, both on uvloop), counted.

Throughput on a shared 2-core machine moves from round to round; what a request costs does not.
Each server runs one worker process; one keep-alive client sends N1, then (a second run) N2
requests, and the difference over N2 - N1 is the cost of one request, start-up cancelled out:

- user-space instructions per request, by object (the server's own code, libpython, libc, the
  kernel-call wrappers...), counted by valgrind's callgrind;
- system calls per request, by name, counted by `strace -c` on the same runs without valgrind.

What the kernel does inside those calls (TCP over loopback, wake-ups) is the same work for every
server; the counts say what each server adds to it.

    python benchmarks/request_profile.py [--python 3.11] [--requests 2000,12000] [--only engine,pool,bjoern]
    python benchmarks/request_profile.py --only asgi,uvicorn   # an ASGI request: refork against uvicorn

refork and bjoern run from benchmarks/.venv-X.Y (benchmarks/setup.sh).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from common import BENCH_DIR, free_port, print_table, script_parser, venv_dir
from instructions import send_requests

APPS = BENCH_DIR / "apps"
SERVERS: dict[str, list[str]] = {
    # refork -w 1 (one worker, the mold and the monitor around it), one generation
    "engine": ["--threads", "1", "--wsgi-loop", "native"],
    "pool": ["--threads", "4", "--wsgi-loop", "native"],
    "python": ["--threads", "1", "--wsgi-loop", "python"],
    "bjoern": [],
    # ASGI: refork's protocol on uvloop against uvicorn's (httptools + uvloop), one process each
    "asgi": ["--interface", "asgi", "--loop", "uvloop"],
    "uvicorn": [],
}


def command(python: Path, name: str, port: int) -> list[str]:
    if name == "bjoern":
        return [str(python), str(APPS / "bjoern_run.py"), "hello_wsgi:app", "127.0.0.1", str(port), "1"]
    if name == "uvicorn":
        return [str(python), "-m", "uvicorn", "--http", "httptools", "--loop", "uvloop", "--no-access-log",
                "--log-level", "warning", "--host", "127.0.0.1", "--port", str(port),
                "hello_asgi:app"]  # fmt: skip
    app = "hello_asgi:app" if "asgi" in SERVERS[name] else "hello_wsgi:app"
    return [
        str(python), "-m", "refork", "-w", "1", "--control-socket", "off", "--chdir", str(APPS),
        "--refork-after", "off", "-b", f"127.0.0.1:{port}", *SERVERS[name], app,
    ]  # fmt: skip


def run(tool: Sequence[str], python: Path, name: str, count: int) -> Path:
    """The server under `tool` (its output files in the returned folder), `count` requests sent."""
    out = Path(tempfile.mkdtemp(prefix="refork-profile-"))
    port = free_port()
    cmd = [*(part.replace("{out}", str(out)) for part in tool), *command(python, name, port)]
    proc = subprocess.Popen(cmd, cwd=APPS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    try:
        send_requests(port, count)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(120)
    return out


def instructions_by_object(python: Path, name: str, count: int) -> collections.Counter[str]:
    out = run(["valgrind", "--tool=callgrind", "--callgrind-out-file={out}/out.%p"], python, name, count)
    worker = max(out.glob("out.*"), key=lambda path: int(path.name.split(".")[1]))  # the last forked
    text = subprocess.run(["callgrind_annotate", "--threshold=100", str(worker)], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    by_object: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        found = re.match(r"\s*([\d,]+)\s+\([^)]*\)\s+\S+?:\S+ \[(.+)\]$", line)
        if found:
            by_object[_object(found.group(2))] += int(found.group(1).replace(",", ""))
    return by_object


def _object(path: str) -> str:
    base = os.path.basename(path)
    for known, label in (("/uvloop/", "uvloop (libuv)"), ("/httptools/", "httptools (llhttp)")):
        if known in path:
            return label
    for known, label in (("_native", "refork native (Rust)"), ("bjoern", "bjoern (C)"), ("libev", "libev"),
                         ("libpython", "libpython"), ("python3", "libpython"), ("libc.so", "libc"),
                         ("ld-linux", "ld.so"), ("vdso", "vdso"), ("_asyncio", "libpython")):  # fmt: skip
        if known in base:
            return label
    return "other: " + base


def syscalls_by_name(python: Path, name: str, count: int) -> collections.Counter[str]:
    out = run(["strace", "-f", "-qq", "-c", "-U", "name,calls", "-o", "{out}/strace"], python, name, count)
    calls: collections.Counter[str] = collections.Counter()
    for line in (out / "strace").read_text().splitlines():
        found = re.match(r"\s*(\w+)\s+(\d+)\s*$", line)
        if found and found.group(1) not in ("total", "syscall"):
            calls[found.group(1)] += int(found.group(2))
    return calls


def per_request(low: collections.Counter[str], high: collections.Counter[str], n: int) -> dict[str, float]:
    """What one request adds to each count (differences under 0.05 per request left out)."""
    diff = {key: (high[key] - low[key]) / n for key in set(low) | set(high)}
    return {key: value for key, value in diff.items() if abs(value) >= 0.05}


def main() -> None:
    parser = script_parser(__doc__)
    parser.add_argument("--requests", default="2000,12000", help="the two request counts N1,N2")
    parser.add_argument("--only", default=",".join(SERVERS), help=f"servers, of {','.join(SERVERS)}")
    args = parser.parse_args()
    python = venv_dir(args.python) / "bin" / "python"
    n1, n2 = (int(n) for n in args.requests.split(","))
    names = args.only.split(",")
    instructions = {}
    syscalls = {}
    for name in names:
        instructions[name] = per_request(instructions_by_object(python, name, n1),
                                         instructions_by_object(python, name, n2), n2 - n1)  # fmt: skip
        syscalls[name] = per_request(syscalls_by_name(python, name, n1), syscalls_by_name(python, name, n2),
                                     n2 - n1)  # fmt: skip
        print(f"{name}: {sum(instructions[name].values()):,.0f} instructions, "
              f"{sum(syscalls[name].values()):.2f} system calls per request", flush=True)  # fmt: skip
    print(f"\nuser-space instructions per request, by object ({sys.argv[0]} --requests {args.requests})")
    objects = sorted({o for per in instructions.values() for o in per},
                     key=lambda o: -max(per.get(o, 0) for per in instructions.values()))  # fmt: skip
    rows = [[o, *(f"{instructions[n].get(o, 0):,.0f}" for n in names)] for o in objects]
    rows.append(["total", *(f"{sum(instructions[n].values()):,.0f}" for n in names)])
    print_table(["object", *names], rows)
    print("\nsystem calls per request, by name")
    calls = sorted({c for per in syscalls.values() for c in per})
    rows = [[c, *(f"{syscalls[n].get(c, 0):.2f}" for n in names)] for c in calls]
    rows.append(["total", *(f"{sum(syscalls[n].values()):.2f}" for n in names)])
    print_table(["system call", *names], rows)


if __name__ == "__main__":
    sys.exit(main())
