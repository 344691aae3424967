"""App code tells refork a worker must never be forked from (a promotion would copy bad state).

App code calls it as `refork.mark_fork_unsafe()`; the worker and the mold read it. It imports
nothing, so `import refork` stays cheap and any layer may read the flag.
"""

from __future__ import annotations

_unsafe_reason: str | None = None


def mark_fork_unsafe(reason: str) -> None:
    """This process holds state that must not be inherited (a live connection, a thread...).

    A worker marked so is never promoted to be the next mold; `refork status` shows the reason.
    """
    global _unsafe_reason
    if _unsafe_reason is None:
        _unsafe_reason = str(reason) or "marked fork-unsafe"


def is_fork_safe() -> bool:
    return _unsafe_reason is None


def unsafe_reason() -> str | None:
    return _unsafe_reason


def reset() -> None:
    """A fresh mold starts fork-safe."""
    global _unsafe_reason
    _unsafe_reason = None
