"""The monitor's own memory on a real server (a Django site): it loads none of the layers it never
runs, and its unique memory (USS) stays within a bound per interpreter (docs/memory.md)."""

from __future__ import annotations

import sys

from refork.memory.accounting import read_memory

# MiB: the most measured on this 2-core machine with the Django site below (docs/memory.md), busy,
# plus ~0.5 MiB (from one start to the next it varies by up to 1.2 MiB).
# The goal is 5 MiB; above it, the monitor's pages that the mold writes become the monitor's alone:
# 3.10 and 3.11 immortalize nothing, so the mold's reference counts write to nearly every page.
USS_LIMIT_MIB = {(3, 10): 9.75, (3, 11): 9.5, (3, 12): 6.75, (3, 13): 7.5, (3, 14): 7.75, (3, 15): 6.75}

# Extension modules of what the monitor never runs: TLS and asyncio (the fork integrations, the
# serving layer), the HTTP parser, pickle (logging.handlers and logging.config, for syslog and a
# user's logging config only), bz2 and lzma (shutil: argparse's help width, the mold's tempfile).
# (random stays: tempfile names the control socket's directory with it.)
UNUSED_EXTENSIONS = ("/_ssl.", "/_asyncio.", "/httptools/", "/_pickle.", "/_bz2.", "/_lzma.")


def mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as f:
        return {line.split()[-1] for line in f if "/" in line}


def test_the_monitor_of_a_django_site_loads_only_what_it_runs_and_stays_small(start_server):
    server = start_server(app="apps.django_site:application", workers=2)
    assert server.get("/") == (200, b"hello from django")
    server.wait_for(lambda: "server ready" in server.log(), what="the ready milestone")
    monitor = server.proc.pid
    loaded = sorted(f for f in mapped_files(monitor) if any(part in f for part in UNUSED_EXTENSIONS))
    assert loaded == []
    memory = read_memory(monitor)
    assert memory is not None
    limit = USS_LIMIT_MIB.get(sys.version_info[:2], max(USS_LIMIT_MIB.values()))
    assert memory.uss / 2**20 < limit, f"the monitor's USS is {memory.uss / 2**20:.2f} MiB"
