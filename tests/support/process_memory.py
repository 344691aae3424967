"""A process's memory as /proc reports it, for tests that bound a worker's."""

from __future__ import annotations


def rss_kib(pid: int) -> int:
    """The resident set of a process (VmRSS), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")
