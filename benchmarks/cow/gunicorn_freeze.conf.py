"""gunicorn config: the usual "gc.freeze before fork" recipe, the strongest gunicorn baseline.

Use with --preload: the master imports the app, then collects and freezes the heap so the
workers' collections never touch (and so never copy) the pages the app lives in.
"""

import gc


def when_ready(server: object) -> None:
    gc.disable()
    gc.collect()
    gc.freeze()


def pre_fork(server: object, worker: object) -> None:
    gc.collect()
    gc.freeze()


def post_fork(server: object, worker: object) -> None:
    gc.enable()
