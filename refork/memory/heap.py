"""Prepare the mold's heap so that forked workers share it instead of copying it.

Order matters (see /work/shared/research/cpython-copy-on-write.md):

1. ``gc.disable()`` first thing in the mold, so collections do not leave holes in
   shared pages that workers later fill (which dirties them).
2. Before fork: load what ``lazy import`` (PEP 810, 3.15+) left pending, ``gc.collect()``
   once (no cyclic garbage gets frozen), then make the heap immortal (3.12+: refcount
   writes are the main source of copy-on-write), then ``gc.freeze()`` (the GC never writes
   to frozen objects' headers again), then return the C allocator's free memory to the OS
   (malloc_trim, jemalloc's purge): what the import and the collection freed would otherwise be
   mapped by every worker, and written into by its first allocations.
3. ``gc.enable()`` in each worker.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import time
import types
from dataclasses import dataclass
from types import FrameType

from refork.memory.allocator import release_free_memory

try:
    from refork.memory import _immortal
except ImportError as exc:  # not built (e.g. running from a source tree without the extension)
    _BUILD_ERROR = str(exc)  # and `_immortal` stays unbound: every use checks _BUILD_ERROR first
else:
    _BUILD_ERROR = ""


@dataclass
class HeapReport:
    """What prepare_heap_for_fork did, for the mold's start-up log line."""

    collected: int
    immortalized: int
    frozen: int
    seconds: float
    immortalize: str  # e.g. "on (412,345 objects)", "off (--no-immortalize)", "unsupported: ..."
    lazy_imports: int = 0  # pending lazy imports (PEP 810) resolved before the fork
    release: str = ""  # how the C allocator's free memory went back: "malloc_trim", "jemalloc purge"
    released: int = 0  # bytes of RSS it gave back

    def describe(self) -> str:
        """The mold's log line: what the preparation did and how long it took."""
        lazy = f", lazy imports resolved {self.lazy_imports}" if self.lazy_imports else ""
        released = f"{self.released / (1 << 20):.1f} MiB ({self.release})"
        freed = f", free heap returned {released}" if self.release else ""
        return (
            f"heap: collected {self.collected}, frozen {self.frozen}, immortalize {self.immortalize}"
            f"{lazy}{freed} ({self.seconds * 1000:.0f} ms)"
        )


def immortalize_support() -> tuple[bool, str]:
    """Whether this interpreter can be immortalized, and if not, why (for logs and status)."""
    if sys.implementation.name != "cpython":
        return False, f"{sys.implementation.name} (needs CPython 3.12+)"
    if _BUILD_ERROR:
        return False, f"native extension not built ({_BUILD_ERROR})"
    return _immortal.supported()


def immortalize_heap() -> int:
    """Make everything reachable from the GC-tracked heap immortal; return the count.

    Frozen objects are invisible to the heap walk, so this unfreezes first; callers
    should freeze again afterwards (prepare_heap_for_fork does).
    """
    ok, reason = immortalize_support()
    if not ok:
        raise RuntimeError(f"immortalization unsupported: {reason}")
    gc.unfreeze()
    return _immortal.immortalize_heap(_frame_locals())


def _frame_locals() -> list[object]:
    """Local variables of every running frame: the GC's lists do not reach them.

    Frames of this module are skipped: their locals are our own temporaries.
    """
    values: list[object] = []
    for top in sys._current_frames().values():
        frame: FrameType | None = top
        while frame is not None:
            if frame.f_globals is not globals():
                try:
                    values.extend(frame.f_locals.values())
                except Exception:  # a broken locals mapping must not stop the preparation
                    pass
            frame = frame.f_back
    return values


def is_immortal(obj: object) -> bool:
    """True if obj's refcount is immortal (always False where unsupported)."""
    return not _BUILD_ERROR and _immortal.is_immortal(obj)


def resolve_lazy_imports() -> int:
    """Import what ``lazy import`` (PEP 810, 3.15+) left pending and rebind its placeholders.

    A module still pending in the mold would be imported by every worker on first use, after
    the fork, into memory of its own. And a placeholder stays in its module's globals until
    code there first uses it, when the interpreter rebinds it: a write into a shared dict in
    every worker. So, until nothing is left (a module loaded here may have lazy imports of its
    own): import every name ``sys.lazy_modules`` still lists, and replace every placeholder in
    a module's globals by what it resolves to. An import that fails is left to fail where the
    app would have met it. Returns how many names and placeholders were resolved.
    """
    placeholder = getattr(types, "LazyImportType", None)
    pending = getattr(sys, "lazy_modules", None)
    if placeholder is None or pending is None:
        return 0
    resolved = 0
    for _ in range(50):  # a bound, in case an import keeps adding lazy imports of new names
        progress = 0
        for name in sorted(pending):  # also "package.attribute" of `lazy from`: ImportError
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except Exception:  # the app meets the error on first use, as it would have
                    continue
                progress += 1
        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict):
                continue
            for key, value in list(namespace.items()):
                if type(value) is placeholder:
                    try:
                        namespace[key] = value.resolve()
                    except Exception:  # left for the app to meet on first use
                        continue
                    progress += 1
        if not progress:
            break
        resolved += progress
    return resolved


def prepare_heap_for_fork(*, immortalize: bool, lazy_imports: bool = True) -> HeapReport:
    """Collect, optionally immortalize, freeze, and return the free heap to the OS: the last step
    in a mold before forking. lazy_imports=False leaves pending lazy imports pending (the monitor:
    what it never runs, it should not import for its molds, which resolve their own).

    Safe to call again in a promoted mold: the collection only looks at objects created
    since the last freeze, the unfreeze is an O(1) list splice, already-immortal objects
    are skipped cheaply, and new objects (also those stored in old, immortal containers)
    are reached because every GC object is a root of the walk.
    """
    start = time.perf_counter()
    lazy = resolve_lazy_imports() if lazy_imports else 0
    # Collect before unfreezing: it then only scans the young objects and never writes
    # to the headers of objects frozen by an earlier mold (still shared with it).
    collected = gc.collect()
    immortalized = 0
    if not immortalize:
        state = "off (--no-immortalize)"
    else:
        ok, reason = immortalize_support()
        if ok:
            try:
                immortalized = immortalize_heap()
            except (MemoryError, RuntimeError) as exc:
                # Objects marked before the failure stay immortal (harmless); still freeze.
                state = f"failed: {exc!r}"
            else:
                state = f"on ({immortalized:,} objects)"
        else:
            state = f"unsupported: {reason}"
    gc.freeze()
    before = _rss()
    release = release_free_memory()
    return HeapReport(
        collected=collected,
        immortalized=immortalized,
        frozen=gc.get_freeze_count(),
        seconds=time.perf_counter() - start,
        immortalize=state,
        lazy_imports=lazy,
        release=release,
        released=max(0, before - _rss()),
    )


def _rss() -> int:
    """This process's resident set in bytes (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def disable_gc_early() -> None:
    """Called first thing in the mold: collections while importing leave holes that workers fill."""
    gc.disable()


def after_fork_in_child() -> None:
    """Called first thing in each worker: the young heap needs collecting again."""
    gc.enable()
