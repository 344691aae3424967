"""Who wrote the monitor's own pages: the mold (the monitor's copy unchanged since the fork) or the monitor.

Serves the Django test site (tests/apps/django_site.py, 2 workers, one generation) with refork,
the monitor running in this script so that a checksum of each of its writable private pages is
taken just before it forks the mold. Once the server is ready and has answered a request, every
page only the monitor maps (its USS) is compared with that checksum: unchanged means the mold
wrote its copy (the page was shared, the mold's write made the monitor's copy its alone);
changed means the monitor wrote it. Needs root (/proc/PID/pagemap's frame and exclusive bits).

    python benchmarks/monitor_pages.py --python 3.12
"""

from __future__ import annotations

import array
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import zlib
from collections import Counter
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = os.sysconf("SC_PAGE_SIZE")


def writable_private(pid: int | str) -> list[tuple[int, int, str]]:
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if fields[1].startswith("rw") and fields[1][3] == "p":
                start, end = (int(x, 16) for x in fields[0].split("-"))
                out.append((start, end, fields[5].strip() if len(fields) > 5 else "[anon]"))
    return out


def checksum_before_fork(monitor: int) -> None:
    """In the monitor, before each of its forks (the last one is the mold's): page -> crc32. The
    mold inherits the hook: its forks (the workers) are not the monitor's."""
    if os.getpid() != monitor:
        return
    sums = array.array("Q")
    mem = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        for start, end, _ in writable_private("self"):
            for page in range(start, end, PAGE):
                try:
                    sums.extend((page, zlib.crc32(os.pread(mem, PAGE, page))))
                except OSError:
                    continue
    finally:
        os.close(mem)
    with open(os.environ["MONITOR_PAGES_OUT"], "wb") as f:
        sums.tofile(f)


def account(monitor: int, sums_path: str) -> Counter[tuple[str, str]]:
    """MiB of the monitor's exclusive pages, by mapping kind and by who wrote them."""
    sums = array.array("Q")
    with open(sums_path, "rb") as f:
        sums.frombytes(f.read())
    before = dict(zip(sums[0::2], sums[1::2], strict=True))
    mib: Counter[tuple[str, str]] = Counter()
    mem = os.open(f"/proc/{monitor}/mem", os.O_RDONLY)
    with open(f"/proc/{monitor}/pagemap", "rb") as pagemap:
        for start, end, name in writable_private(monitor):
            pagemap.seek(start // PAGE * 8)
            entries = struct.iter_unpack("<Q", pagemap.read((end - start) // PAGE * 8))
            for i, (entry,) in enumerate(entries):
                if not (entry >> 63 & 1 and entry >> 56 & 1):  # present, mapped by this process alone
                    continue
                page = start + i * PAGE
                kind = name if name in ("[anon]", "[heap]") else "files' data"
                if page not in before:
                    who = "new since the fork"
                elif zlib.crc32(os.pread(mem, PAGE, page)) == before[page]:
                    who = "the mold wrote"
                else:
                    who = "the monitor wrote"
                mib[(kind, who)] += PAGE / 2**20
    os.close(mem)
    return mib


def main() -> None:
    if sys.argv[1:2] == ["--serve"]:  # the monitor: refork's command line, with the hook
        os.register_at_fork(before=partial(checksum_before_fork, os.getpid()))
        from refork.cli import main as refork_main

        sys.argv = ["refork", *sys.argv[2:]]
        sys.exit(refork_main())
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from common import venv_dir  # benchmarks/.venv-X.Y (benchmarks/setup.sh)

    python = str(venv_dir(sys.argv[2] if sys.argv[1:2] == ["--python"] else None) / "bin" / "python")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sums_path = f"/tmp/refork-monitor-pages-{port}.bin"
    log_path = f"/tmp/refork-monitor-pages-{port}.log"
    args = ["-b", f"127.0.0.1:{port}", "--chdir", str(ROOT / "tests"), "-w", "2", "--refork-after", "off",
            "--mold-idle-exit", "off", "apps.django_site:application"]
    env = {**os.environ, "MONITOR_PAGES_OUT": sums_path, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        server = subprocess.Popen([python, __file__, "--serve", *args], cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while b"server ready" not in Path(log_path).read_bytes():
            if time.monotonic() > deadline or server.poll() is not None:
                sys.exit(f"the server did not start: see {log_path}")
            time.sleep(0.2)
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
        time.sleep(1.5)
        mib = account(server.pid, sums_path)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
    print(f"CPython {version}: the monitor's USS, {sum(mib.values()):.2f} MiB of private writable pages")
    for (kind, who), size in sorted(mib.items()):
        print(f"  {size:6.2f} MiB  {kind:12s} {who}")
    os.unlink(sums_path)


if __name__ == "__main__":
    main()
