"""`--pid FILE`: the monitor's pid for init scripts and `kill -HUP $(cat FILE)`.

Written atomically (a reader never sees a half-written number), refused while another live
process holds it, replaced when stale, and removed on exit only if it is still ours.
"""

from __future__ import annotations

import os

from refork.errors import ConfigError


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip() or 0) or None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def write_pidfile(path: str) -> None:
    """Claim `path` for this process; ConfigError if a live process other than us holds it."""
    holder = _read_pid(path)
    if holder is not None and holder != os.getpid() and _alive(holder):
        raise ConfigError(
            f"--pid {path}: pid {holder} is running and holds it; stop that server, or give another file"
        )
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        why = f"{e.strerror}; check that its directory exists and is writable"
        raise ConfigError(f"--pid {path}: {why}") from None


def remove_pidfile(path: str) -> None:
    """Remove `path` if it still names this process (a successor may have claimed it)."""
    if _read_pid(path) == os.getpid():
        try:
            os.unlink(path)
        except OSError:
            pass
