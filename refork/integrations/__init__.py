"""Built-in fork integrations: each library's fix applied for the app, found when the app imports it.

The mold activates them after the app is loaded (refork never imports a library the app did not),
finds their objects (engines, pools, clients) in one pass over the heap, and runs each step:
before every fork in the mold, after the fork in each worker, before a worker's promotion. This
package imports nothing of refork but itself, so the config layer can read `NAMES`.
"""

from __future__ import annotations

import gc
import itertools
import logging
import time
import weakref
from typing import Any

from refork.integrations import django, grpc, http, numpy, psycopg, redis, sqlalchemy, unsafe
from refork.integrations.base import Integration

log = logging.getLogger("refork")
ALL: tuple[Integration, ...] = tuple(
    module.INTEGRATION for module in (django, sqlalchemy, psycopg, redis, http, grpc, numpy, unsafe)
)
NAMES: tuple[str, ...] = tuple(integration.name for integration in ALL)


def prepare_environment(selected: list[str]) -> list[str]:
    """Before the app is imported: environment a library reads at import (gRPC's fork support)."""
    return [set_] if "grpc" in selected and (set_ := grpc.prepare_environment()) else []


class Active:
    """The integrations active in this process and the objects they found (weakly held)."""

    def __init__(self, integrations: list[Integration]) -> None:
        self.integrations = integrations
        self.found: dict[str, list[Any]] = {i.name: [] for i in integrations}
        self.scan_seconds = 0.0

    def scan(self) -> None:
        """One pass over the heap (gc.get_objects: frozen objects excluded) for every class watched.

        The watched classes and every subclass of theirs that exists now, in one set: the pass is
        then a set lookup per object, all in C (about 0.1 s for a million objects, once per mold;
        at a promotion only the objects made since the fork are visited).
        """
        start = time.perf_counter()
        names_of: dict[type, set[str]] = {}
        for integration in self.integrations:
            for cls in integration.resolve_classes():
                for kind in _with_subclasses(cls):
                    names_of.setdefault(kind, set()).add(integration.name)
        if not names_of:
            return
        watched = set(names_of)
        objects = gc.get_objects()
        for obj in list(itertools.compress(objects, map(watched.__contains__, map(type, objects)))):
            for name in sorted(names_of[type(obj)]):
                self._add(name, obj)
        self.scan_seconds = time.perf_counter() - start

    def _add(self, name: str, obj: Any) -> None:
        known = self.found[name]
        if any(_deref(ref) is obj for ref in known):
            return
        try:
            known.append(weakref.ref(obj))
        except TypeError:
            known.append(obj)  # no weak references: kept (these objects live as long as the app anyway)

    def objects(self, name: str) -> list[Any]:
        alive = [obj for obj in map(_deref, self.found[name]) if obj is not None]
        return alive

    def run(self, step: str) -> None:
        """Run `step` (before_fork, after_fork, before_promotion, after_promotion) of each integration."""
        for integration in self.integrations:
            action = getattr(integration, step) or integration.after_fork
            try:
                action(self.objects(integration.name))
            except Exception:
                log.exception("fork integrations: %s %s failed", integration.name, step.replace("_", " "))

    def warnings(self) -> list[str]:
        said = []
        for integration in self.integrations:
            said += integration.warnings(self.objects(integration.name))
        return said


def _with_subclasses(cls: type) -> list[type]:
    found, todo = [], [cls]
    while todo:
        kind = todo.pop()
        if kind not in found:
            found.append(kind)
            try:
                todo.extend(kind.__subclasses__())
            except TypeError:  # type.__subclasses__ needs an argument
                pass
    return found


def _deref(ref: Any) -> Any:
    return ref() if isinstance(ref, weakref.ref) else ref


_active = Active([])


def activate(selected: list[str]) -> Active:
    """In a fresh mold once the app is loaded: log which are active, find their objects, warn."""
    global _active
    on = [i for i in ALL if i.name in selected and i.imported()]
    off = [i.name for i in ALL if i.name not in selected and i.imported()]
    _active = Active(on)
    _active.scan()
    names = ", ".join(i.name for i in on) or "none"
    suffix = f" (off: {', '.join(off)}: --fork-integrations)" if off else ""
    log.info("fork integrations: %s%s", names, suffix)
    for warning in _active.warnings():
        log.warning("fork integrations: %s", warning)
    return _active


def active() -> Active:
    return _active


def before_fork() -> None:
    _active.run("before_fork")


def after_fork() -> None:
    _active.run("after_fork")


def after_promotion() -> None:
    """In a promoted mold: forget the worker's pooled connections, start nothing."""
    _active.run("after_promotion")


def before_promotion() -> None:
    """Find what the worker made since the fork, then close it (the promoted mold forks with none)."""
    _active.scan()
    _active.run("before_promotion")
