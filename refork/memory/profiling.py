"""Optional per-worker memray capture (--memray DIR), started in the worker after fork.

One tracker per worker, not one in the mold with follow_fork: a tracker runs a background
thread, and the mold must stay single-threaded to fork safely.
"""

from __future__ import annotations

import os

from refork.errors import ConfigError


def _output_path(directory: str, pid: int) -> str:
    path = os.path.join(directory, f"refork-worker-{pid}.bin")
    n = 1
    while os.path.exists(path):  # a recycled pid from an earlier run: keep the old capture
        path = os.path.join(directory, f"refork-worker-{pid}.{n}.bin")
        n += 1
    return path


def start_memray(directory: str, pid: int) -> object:
    """Start tracking this worker into DIR/refork-worker-<pid>.bin; stop with stop_memray."""
    try:
        import memray
    except ImportError:
        raise ConfigError("--memray needs memray: pip install 'refork[memray]'") from None
    os.makedirs(directory, exist_ok=True)
    tracker = memray.Tracker(
        _output_path(directory, pid), file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS
    )
    tracker.__enter__()
    return tracker


def stop_memray(tracker: object) -> None:
    """Flush and close a capture started by start_memray (before the worker exits)."""
    tracker.__exit__(None, None, None)  # type: ignore[attr-defined]
