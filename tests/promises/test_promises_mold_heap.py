"""Nothing a mold freed reaches a worker, on every request path, under glibc and jemalloc.

The app (tests/apps/freed_at_import.py) allocates and frees 256 MiB at import, below a small live
heap, and again in a worker on `/litter`. Every mold, the first and each promoted one, returns the
free memory of its C allocator before it forks (malloc_trim(0), or a purge of jemalloc's arenas), so
each worker's RSS is near what the process held before that import, not a mapping of the garbage.
"""

from __future__ import annotations

import signal
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.request_paths import PATHS, flags
from test_promises import get
from test_promises_memory import MIB, rss

from refork.memory.allocator import find_jemalloc

APP = "apps.freed_at_import"
FREED = 256 * MIB  # apps.freed_at_import.GARBAGE
# A worker holds the app's live heap, the server modules imported after it, its loop and buffers:
# 3-6 MiB over the baseline measured, against about 256 MiB more without the mold's release.
MARGIN = 64 * MIB

# Every path under glibc; under jemalloc one path of each interface (its purge is the mold's, the same
# whatever serves the requests after the fork).
JEMALLOC = pytest.mark.skipif(find_jemalloc() is None, reason="libjemalloc2 not installed")
cases = pytest.mark.parametrize("path, allocator", [
    *((path, "glibc") for path in PATHS),
    *(pytest.param(path, "jemalloc", marks=JEMALLOC) for path in ("python-1", "uvloop")),
])  # fmt: skip


def near_baseline(server, path: str, what: str) -> None:
    """Each ready worker, having served a request on the path's loop, holds under MARGIN over the
    app's baseline."""
    workers = {w["pid"] for w in server.workers()}
    baseline, served = 0, set()
    while served != workers:
        status, body = get(server, path)
        assert status == 200, (status, body)
        baseline, pid = map(int, body.split())
        served.add(pid)
    for pid in workers:
        held = rss(pid)
        assert held < baseline + MARGIN, (
            f"{what}: worker {pid} holds {held / MIB:.0f} MiB, the app's baseline is {baseline / MIB:.0f} "
            f"MiB; {FREED / MIB:.0f} MiB were freed before the fork"
        )


@cases
def test_nothing_a_mold_freed_reaches_a_worker(start_server, path, allocator):
    chosen, app = flags(path, APP)
    choice = ["--allocator", "jemalloc"] if allocator == "jemalloc" else []
    server = start_server(*chosen, *choice, "--refork-after", "off", app=app, workers=2, defaults=True)
    assert server.status()["allocator"] == allocator
    near_baseline(server, path, "forked by the first mold")
    littered: set[int] = set()
    with ThreadPoolExecutor(2) as pool:  # two at once: a worker busy littering leaves one to the other
        while len(littered) < 2:  # whichever worker is promoted has freed GARBAGE bytes of its own
            answers = pool.map(lambda _: get(server, path, "/litter", timeout=30), range(2))
            littered.update(int(body.split()[1]) for _, body in answers)
    server.signal(signal.SIGUSR2)
    server.wait_for(lambda: server.one_generation(2) == 1, timeout=30, what="generation 1 everywhere")
    near_baseline(server, path, "forked by a promoted mold")
