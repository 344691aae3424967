"""refork: a pre-fork HTTP server for Python WSGI/ASGI apps, with reforking and fork safety."""

from __future__ import annotations

from refork.deadlines import extend_deadline
from refork.fork_safety import is_fork_safe, mark_fork_unsafe
from refork.lifecycle import after_fork, before_fork, before_promotion, keep_fd, per_process

__version__ = "0.1.0"
__all__ = [
    "__version__",
    "after_fork",
    "before_fork",
    "before_promotion",
    "extend_deadline",
    "is_fork_safe",
    "keep_fd",
    "mark_fork_unsafe",
    "per_process",
]
