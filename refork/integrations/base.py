"""What an integration is: the library it watches, the objects it finds, what it does at each fork step."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("refork")
Step = Callable[[list[Any]], None]
"""Given the live objects of the integration's classes found in this process."""


def nothing(objects: list[Any]) -> None:
    pass


def no_warnings(objects: list[Any]) -> list[str]:
    return []


@dataclass(frozen=True)
class Integration:
    name: str  # as --fork-integrations spells it
    modules: tuple[str, ...]  # active when one of these is imported (never imported by refork)
    classes: tuple[str, ...] = ()  # "module:Class": instances to find in the heap
    before_fork: Step = nothing  # in the mold, before each fork
    after_fork: Step = nothing  # in each new worker (and a promoted mold), first thing
    before_promotion: Step = nothing  # in a worker, at the safe point before it forks the next mold
    after_promotion: Step | None = None  # in the promoted mold, first thing (default: after_fork)
    warnings: Callable[[list[Any]], list[str]] = no_warnings  # what it cannot fix, said once in the mold
    native_threads: Callable[[], int] = lambda: 0  # its threads that a fork handles on its own

    def imported(self) -> bool:
        return any(module in sys.modules for module in self.modules)

    def resolve_classes(self) -> list[type]:
        """The classes of `classes` whose module is imported (looked up, never imported)."""
        found = []
        for spec in self.classes:
            module_name, _, qualname = spec.partition(":")
            obj: Any = sys.modules.get(module_name)
            for part in qualname.split("."):
                obj = getattr(obj, part, None)
            if isinstance(obj, type):
                found.append(obj)
        return found


def run_coroutine(make: Callable[[], Any]) -> bool:
    """Run an async close in a process with no running loop (the mold); False if one is running."""
    import asyncio  # here: the config (and so the monitor) reads this package, never needs asyncio

    try:
        asyncio.get_running_loop()
        return False
    except RuntimeError:
        pass
    try:
        asyncio.run(make())
        return True
    except Exception as e:  # a loop-bound object from the warm-up loop, say
        log.debug("fork integrations: async close failed: %r", e)
        return False


def shut_down(sock: Any) -> None:
    """End a connection whose object cannot be closed here (bound to a loop that is gone).

    shutdown() tells the peer the connection is over and frees nothing: the descriptor number
    stays taken until its object closes it, so it is never reused under that object.
    """
    if sock is None:
        return
    try:
        borrowed = socket.socket(fileno=sock.fileno())
    except (OSError, ValueError):
        return
    try:
        borrowed.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        borrowed.detach()


def each(objects: list[Any], what: str, action: Callable[[Any], None]) -> None:
    """Apply `action` to each object; one failing object is logged and does not stop the others."""
    for obj in objects:
        try:
            action(obj)
        except Exception as e:
            log.warning("fork integrations: %s %r failed: %r", what, obj, e)
