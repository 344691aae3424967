"""The monitor's own heap, prepared once before its first fork so the molds share it.

Every mold is forked from the monitor, so the interpreter and refork's modules start out shared.
A page stays shared only while nobody writes it, and a mold writes nearly every one: it
immortalizes what it inherited (a store into each object's refcount) and its collector moves
objects between lists. Each page it writes becomes the monitor's alone: the monitor's unique
memory grew to about 15 MiB this way. Collecting, immortalizing and freezing the monitor's heap
before the first fork leaves the molds nothing to write there (an object already immortal is
skipped by their walk; a frozen one by their collector), so the monitor keeps about 3 MiB of its
own on 3.12+ (5 on 3.11, where only the freeze applies).

An immortal heap in the monitor is inherited by every mold, including one started without
immortalization after a crash (refork.process.supervisor.starts). So the monitor first forks a
canary that immortalizes its own copy of this heap and works it (the collector, calls,
allocations, an import); only if the canary exits cleanly does the monitor immortalize itself.
A canary killed by a signal means this interpreter's immortalization is broken: the monitor
only freezes, and no mold immortalizes either.
"""

from __future__ import annotations

import gc
import os
import signal
import time

from refork.memory.allocator import fill_free_chunks, fill_pymalloc_blocks
from refork.memory.heap import immortalize_support, prepare_heap_for_fork

CANARY_TIMEOUT = 5.0  # seconds for the canary's work (tens of milliseconds in practice)
_PADDING: list[object] = []  # what fills pymalloc's free blocks: immortal with the rest


def prepare_monitor_heap(immortalize: bool) -> tuple[bool, str]:
    """(whether immortalization is safe here, a detail for the log). Call once, before the first
    fork of a mold; `immortalize` is the config's (--no-immortalize: only collect and freeze).
    The free blocks of pymalloc's pools and the C heap's free chunks are filled, so that a mold
    allocates elsewhere than on the pages it shares with the monitor."""
    gc.collect()  # (what it frees is a free block too)
    _PADDING.extend(fill_pymalloc_blocks())
    prepared = _prepare(immortalize)
    fill_free_chunks()
    return prepared


def _prepare(immortalize: bool) -> tuple[bool, str]:
    supported, why = immortalize_support()
    if not immortalize or not supported:
        report = prepare_heap_for_fork(immortalize=False, lazy_imports=False)
        return True, f"frozen {report.frozen} objects"
    survived, how = _canary()
    if not survived:
        prepare_heap_for_fork(immortalize=False, lazy_imports=False)
        return False, how
    report = prepare_heap_for_fork(immortalize=True, lazy_imports=False)
    return True, f"immortalize {report.immortalize}, frozen {report.frozen}"


def _canary() -> tuple[bool, str]:
    """Fork a child that immortalizes this heap and works it: (it exited 0, what happened)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            prepare_heap_for_fork(immortalize=True, lazy_imports=False)
            _work()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + CANARY_TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False, f"the immortalization canary did not finish within {CANARY_TIMEOUT:g}s"
        time.sleep(0.002)
    if os.WIFSIGNALED(status):
        name = signal.Signals(os.WTERMSIG(status)).name
        return False, f"the immortalization canary was killed by {name}"
    if os.WEXITSTATUS(status):
        return False, f"the immortalization canary exited with code {os.WEXITSTATUS(status)}"
    return True, "the immortalization canary survived"


def _work() -> None:
    """What any process does with an inherited immortal heap: collect, call, allocate, free."""
    import json

    for _ in range(3):
        gc.collect()
        data = {str(i): [i, str(i), (i, float(i))] for i in range(2000)}
        text = json.dumps(data, sort_keys=True)
        assert json.loads(text) == json.loads(text)
        try:
            data[text]
        except KeyError:
            pass
        del data, text
        sum(len(name) for name in sorted(os.environ))
    import decimal  # a fresh import: new objects next to the immortal ones

    assert decimal.Decimal("1.5") * 2 == 3
