"""Per-process memory from /proc: what a worker costs on top of what it shares with the mold.

RSS counts shared pages fully in every process, so summing it over workers overstates
memory use. USS (private pages) is what killing a worker frees; PSS splits shared pages
among their sharers and sums to the truth. Reading smaps_rollup walks the page tables
(~5 ms per GiB of RSS, under the target's mmap lock), so sample it every few seconds,
not per request.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ProcessMemory:
    """One smaps_rollup sample, all sizes in bytes."""

    pid: int
    rss: int
    pss: int
    uss: int  # Private_Clean + Private_Dirty (+ Private_Hugetlb): freed if the process exits
    private_dirty: int  # pages this process copied on write or allocated itself
    shared: int  # Shared_Clean + Shared_Dirty: mapped by another process too right now
    swap: int
    minflt: int  # minor faults since the process started (a child's count starts at fork)


def _read_text(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    except OSError:  # ESRCH while the process exits, EACCES under some LSMs
        return None


def _minflt(stat: str) -> int:
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[7])  # field 10 overall: minflt


def read_memory(pid: int) -> ProcessMemory | None:
    """One sample from /proc/PID/smaps_rollup and /proc/PID/stat; None if gone or unreadable."""
    rollup = _read_text(f"/proc/{pid}/smaps_rollup")
    stat = _read_text(f"/proc/{pid}/stat")
    if not rollup or not stat:
        return None
    kb: dict[str, int] = {}
    for line in rollup.splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            kb[key] = int(parts[0])
    if "Rss" not in kb:  # zombie: the address space is already gone
        return None
    try:
        minflt = _minflt(stat)
    except (ValueError, IndexError):
        return None
    return ProcessMemory(
        pid=pid,
        rss=kb["Rss"] * 1024,
        pss=kb.get("Pss", 0) * 1024,
        uss=(kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0) + kb.get("Private_Hugetlb", 0)) * 1024,
        private_dirty=kb.get("Private_Dirty", 0) * 1024,
        shared=(kb.get("Shared_Clean", 0) + kb.get("Shared_Dirty", 0)) * 1024,
        swap=kb.get("Swap", 0) * 1024,
        minflt=minflt,
    )


def format_bytes(n: int) -> str:
    """Short human size for status tables: 900B, 300.0K, 512.0M, 1.5G."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{n}B"
    value = float(n)
    for unit in "KMGT":
        value /= 1024
        if value < 1024 or unit == "T":
            return f"{sign}{value:.1f}{unit}"
    raise AssertionError("unreachable")
