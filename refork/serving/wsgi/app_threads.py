"""The app threads of a WSGI worker with ``--threads`` > 1."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("refork")


class AppThreads:
    """App threads we own, so they can be stopped and joined before a fork."""

    def __init__(self, size: int, handler: Callable[..., None]) -> None:
        self.size = size
        self.handler = handler
        self.jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []

    def submit(self, job: tuple[Any, ...]) -> None:
        """A job for the next free thread: handler(*job)."""
        self.jobs.put(job)

    def start(self) -> None:
        for i in range(self.size):
            t = threading.Thread(target=self._run, name=f"refork-wsgi-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join()
        self.threads = []

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                self.handler(*job)
            except SystemExit:  # sys.exit() in app code must not silently shrink the pool
                log.error("SystemExit raised by the app in a pool thread: ignored")
