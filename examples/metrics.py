"""A fork-safety example: an app with a background metrics thread. See docs/fork-safety.md.

    refork --check-config --fork-safety strict --chdir examples metrics_at_import:app   # exit 2
    refork --fork-safety strict -c examples/metrics.conf.py --chdir examples metrics:app  # serves
"""

import os
import threading
import time

flushes = 0


def _flush_forever() -> None:
    global flushes
    while True:
        time.sleep(10)
        flushes += 1


def start_flusher() -> None:
    threading.Thread(target=_flush_forever, name="metrics-flusher", daemon=True).start()


def app(environ, start_response):
    body = f"pid {os.getpid()}, {threading.active_count()} thread(s), {flushes} flush(es)\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
