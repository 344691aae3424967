"""Prepare the mold's heap so that forked workers share it instead of copying it.

Order matters (see /work/shared/research/cpython-copy-on-write.md):

1. ``gc.disable()`` first thing in the mold, so collections do not leave holes in
   shared pages that workers later fill (which dirties them).
2. Before fork: ``gc.collect()`` once (no cyclic garbage gets frozen), then make the
   heap immortal (3.12+: refcount writes are the main source of copy-on-write), then
   ``gc.freeze()`` (the GC never writes to frozen objects' headers again).
3. ``gc.enable()`` in each worker.
"""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass
from types import FrameType

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


def prepare_heap_for_fork(*, immortalize: bool) -> HeapReport:
    """Collect, optionally immortalize, and freeze: the last step in a mold before forking.

    Safe to call again in a promoted mold: the collection only looks at objects created
    since the last freeze, the unfreeze is an O(1) list splice, already-immortal objects
    are skipped cheaply, and new objects (also those stored in old, immortal containers)
    are reached because every GC object is a root of the walk.
    """
    start = time.perf_counter()
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
    return HeapReport(
        collected=collected,
        immortalized=immortalized,
        frozen=gc.get_freeze_count(),
        seconds=time.perf_counter() - start,
        immortalize=state,
    )


def disable_gc_early() -> None:
    """Called first thing in the mold: collections while importing leave holes that workers fill."""
    gc.disable()


def after_fork_in_child() -> None:
    """Called first thing in each worker: the young heap needs collecting again."""
    gc.enable()
