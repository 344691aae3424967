"""Per-request timeouts, to try by hand (see docs/timeouts.md).

    refork --chdir examples -w 1 --threads 4 --request-timeout 2 --graceful-timeout 10 slow:app

    curl localhost:8000/              # the serving pid, at once
    curl localhost:8000/report?3      # 3 s: it calls refork.extend_deadline(30) first, nothing logged
    curl localhost:8000/stuck &       # never answers: after 2 s its stack is logged and the worker
    curl localhost:8000/              #   is replaced (a new pid answers here; nothing is refused)
    refork status                     # while it lasts, the old worker's NOTE says "1 hung"
"""

import os
import threading
import time

import refork

_never = threading.Event()


def wait_for_a_lock_nobody_releases():
    _never.wait()  # what a deadlock looks like from the outside


def build_report(seconds):
    refork.extend_deadline(30)  # known to be long: 30 s more for this request only
    time.sleep(seconds)
    return b"report done\n"


def app(environ, start_response):
    path, query = environ["PATH_INFO"], environ.get("QUERY_STRING") or "3"
    if path == "/stuck":
        wait_for_a_lock_nobody_releases()
        body = b"unreachable\n"
    elif path == "/report":
        body = build_report(float(query))
    else:
        body = f"{os.getpid()}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
