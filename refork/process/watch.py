"""`--reload` (development): notice edited Python files so the monitor can reload like on HUP.

The monitor never imports the app, so it cannot ask which files the app loaded; like uvicorn's
stat reloader, it polls the modification times of `*.py` files under the watched directories.
Virtualenvs, caches and hidden directories are skipped, so a scan of a large project stays cheap.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence

SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "build", "dist"})
SUFFIXES = (".py",)


def _skip(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIRS or name.startswith("venv")


def snapshot(dirs: list[str], extra: Sequence[str] = ()) -> dict[str, float]:
    """Path -> mtime for every watched file under `dirs`, and the files `extra` names (paths or
    glob patterns, expanded at each scan: a file created later is watched too)."""
    seen: dict[str, float] = {}
    for pattern in extra:
        for path in glob.glob(pattern, recursive=True) if glob.has_magic(pattern) else [pattern]:
            try:
                seen[path] = os.stat(path).st_mtime
            except OSError:
                pass
    for top in dirs:
        for root, subdirs, files in os.walk(top):
            subdirs[:] = [d for d in subdirs if not _skip(d)]
            for name in files:
                if name.endswith(SUFFIXES):
                    path = os.path.join(root, name)
                    try:
                        seen[path] = os.stat(path).st_mtime
                    except OSError:
                        pass  # removed while we walked
    return seen


def changed(before: dict[str, float], after: dict[str, float]) -> list[str]:
    """Files added, removed or modified between two snapshots, sorted."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


class Watcher:
    """Polled from the monitor's loop; `poll()` returns the files changed since the last change."""

    def __init__(self, dirs: list[str], interval: float = 1.0, extra: list[str] | None = None) -> None:
        self.dirs = dirs
        self.extra = extra or []  # --reload-extra-file
        self.interval = interval
        self.files = snapshot(dirs, self.extra)
        self.next_scan = time.monotonic() + interval  # the snapshot above is the first scan

    def poll(self, now: float) -> list[str]:
        if now < self.next_scan:
            return []
        self.next_scan = now + self.interval
        current = snapshot(self.dirs, self.extra)
        edits = changed(self.files, current)
        self.files = current
        return edits
