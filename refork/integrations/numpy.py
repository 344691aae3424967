"""numpy: the legacy global generator (`numpy.random.rand()`...) reseeded in each worker.

Without it every worker continues the mold's sequence: they all draw the same "random" numbers.
The stdlib `random` is reseeded by the worker itself (and by CPython's own fork hook).

numpy's OpenBLAS starts a pool of native threads when it loads. OpenBLAS stops that pool in its
own pthread_atfork handler and starts it again on the next call, in parent and child alike, so
the fork check does not count those threads as a hazard.
"""

from __future__ import annotations

import sys
from typing import Any

from refork.integrations.base import Integration


def reseed(objects: list[Any]) -> None:
    random = sys.modules.get("numpy.random")  # numpy 2 loads it on first use: then seeded fresh
    if random is not None:
        random.seed()


_GETTERS = ("openblas_get_num_threads", "scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_")


def openblas_pool_threads() -> int:
    """Threads in the pool of a loaded OpenBLAS: its thread count less the caller; 0 if none is loaded."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return 0
    if not paths:
        return 0
    import ctypes  # here: only a process with OpenBLAS mapped needs it

    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)  # already mapped: this loads nothing new
        except OSError:
            continue
        for name in _GETTERS:
            getter = getattr(library, name, None)
            if getter is not None:
                return max(0, int(getter()) - 1)
    return 0


INTEGRATION = Integration("numpy", ("numpy",), after_fork=reseed, native_threads=openblas_pool_threads)
