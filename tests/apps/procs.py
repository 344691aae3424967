"""Apps for process-model tests: report the serving pid, hang, crash, grow, count, mark fork-unsafe."""

import os
import sys
import time

import refork

_hoard = []
_counted = 0
STARTED_AT = time.time()


def app(environ, start_response):
    path = environ["PATH_INFO"]
    status = "200 OK"
    if path == "/sleep":
        seconds = float(environ.get("QUERY_STRING") or "1")
        time.sleep(seconds)
        body = b"slept"
    elif path == "/crash":
        os._exit(1)
    elif path == "/grow":
        _hoard.append(bytearray(int(environ.get("QUERY_STRING") or 10_000_000)))
        body = b"grew"
    elif path == "/count":  # how many requests this process and its mold ancestry have served
        global _counted
        _counted += 1
        body = str(_counted).encode()
    elif path == "/switch":  # the worker's GIL switch interval (--switch-interval)
        body = repr(sys.getswitchinterval()).encode()
    elif path == "/unsafe":
        refork.mark_fork_unsafe("opened a connection at request time")
        body = b"marked"
    else:
        body = f"{os.getpid()} {os.getppid()}".encode()
    start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def crashing_import_app(environ, start_response):  # pragma: no cover - never reached
    raise RuntimeError("never")


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = f"{os.getpid()}".encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
