"""refork: a pre-fork HTTP server for Python WSGI/ASGI apps, with reforking and fork safety."""

from __future__ import annotations

from refork.fork_safety import is_fork_safe, mark_fork_unsafe

__version__ = "0.1.0"
__all__ = ["__version__", "is_fork_safe", "mark_fork_unsafe"]
