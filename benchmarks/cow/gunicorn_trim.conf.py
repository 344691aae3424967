"""gunicorn config: the tuned "freeze and trim" recipe, the strongest gunicorn baseline for memory.

Use with --preload: once the master has imported the app, collect, freeze, and give glibc's free
heap back to the OS (what the import freed would otherwise be mapped by every worker); each worker
trims again after its fork.
"""

import ctypes
import gc


def _malloc_trim() -> None:
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def when_ready(server: object) -> None:
    gc.collect()
    gc.freeze()
    _malloc_trim()


def post_fork(server: object, worker: object) -> None:
    _malloc_trim()
