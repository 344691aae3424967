"""refork: a pre-fork HTTP server for Python WSGI/ASGI apps, with reforking and fork safety."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "is_fork_safe", "mark_fork_unsafe"]

_LAZY = {"mark_fork_unsafe", "is_fork_safe"}


def __getattr__(name: str) -> Any:
    """Import refork.process.fork_safety only when its names are used: `import refork` stays cheap."""
    if name in _LAZY:
        from refork.process import fork_safety

        return getattr(fork_safety, name)
    raise AttributeError(f"module 'refork' has no attribute {name!r}")
