"""WSGI apps for the loop tests: `hello` (benchmarks), `app` (PEP 3333 checks), `raw` (unvalidated)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import tempfile
import threading
import time
import warnings
from wsgiref.validate import WSGIWarning, validator

warnings.simplefilter("error", WSGIWarning)  # a validator warning fails the request (500)

_lock = threading.Lock()
STATS = {"calls": 0, "closed": 0, "active": 0, "max_active": 0}

_FILE_DATA = b"".join(b"line %05d of the file body\n" % i for i in range(4000))
_file_path = os.path.join(tempfile.gettempdir(), f"refork-test-file-{os.getpid()}.txt")


def _file() -> str:
    if not os.path.exists(_file_path):
        with open(_file_path, "wb") as f:
            f.write(_FILE_DATA)
        atexit.register(_remove_file)
    return _file_path


def _remove_file() -> None:
    with contextlib.suppress(OSError):
        os.unlink(_file_path)


def hello(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "13")])
    return [b"Hello, world!"]


class _Closing:
    """An iterable that records its close() in STATS."""

    def __init__(self, parts, fail_at=None):
        self.parts = parts
        self.fail_at = fail_at

    def __iter__(self):
        for i, part in enumerate(self.parts):
            if i == self.fail_at:
                raise RuntimeError("failing mid-body on purpose")
            yield part

    def close(self):
        with _lock:
            STATS["closed"] += 1


def _json(start_response, obj, status="200 OK"):
    body = json.dumps(obj).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


def _router(environ, start_response):
    with _lock:
        STATS["calls"] += 1
    path = environ["PATH_INFO"]
    inp = environ["wsgi.input"]
    query = environ.get("QUERY_STRING", "")
    if path == "/":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"root"]
    if path == "/echo":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        data = inp.read(length)
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return [data]
    if path == "/readline":
        lines = []
        while True:
            line = inp.readline()
            if not line:
                break
            lines.append(line.decode())
        return _json(start_response, lines)
    if path == "/readlines":
        return _json(start_response, [x.decode() for x in inp.readlines()])
    if path == "/iter":
        return _json(start_response, [x.decode() for x in inp])
    if path == "/write":
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"written ")
        write(b"then ")
        return [b"returned"]
    if path == "/gen":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return (b"part%d;" % i for i in range(5))
    if path == "/environ":
        keys = ("REQUEST_METHOD", "SCRIPT_NAME", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL",
                "SERVER_NAME", "SERVER_PORT", "REMOTE_ADDR", "CONTENT_LENGTH", "CONTENT_TYPE",
                "wsgi.url_scheme", "wsgi.multithread", "HTTP_X_TEST")  # fmt: skip
        return _json(start_response, {k: environ.get(k) for k in keys})
    if path == "/file":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return environ["wsgi.file_wrapper"](open(_file(), "rb"), 4096)
    if path == "/slow":
        with _lock:
            STATS["active"] += 1
            STATS["max_active"] = max(STATS["max_active"], STATS["active"])
        try:
            time.sleep(float(query.partition("=")[2] or 0.5))
        finally:
            with _lock:
                STATS["active"] -= 1
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"slept"]
    if path == "/error":
        raise RuntimeError("app error on purpose")
    if path == "/closing":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return _Closing([b"a", b"b", b"c"])
    if path == "/closing-fail":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return _Closing([b"a", b"b", b"c"], fail_at=1)
    if path == "/closing-big":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return _Closing([b"x" * 65536] * 200)
    if path == "/stats":
        with _lock:
            return _json(start_response, dict(STATS))
    start_response("404 Not Found", [("Content-Type", "text/plain")])
    return [b"not found"]


app = validator(_router)


def raw(environ, start_response):
    """Not wrapped in the validator: file_wrapper keeps its type (sendfile path)."""
    path = environ["PATH_INFO"]
    if path == "/file":
        start_response("200 OK", [("Content-Type", "text/plain")])
        return environ["wsgi.file_wrapper"](open(_file(), "rb"))
    if path == "/file-offset":
        f = open(_file(), "rb")  # noqa: SIM115 - closed by the server via file_wrapper
        f.seek(100)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return environ["wsgi.file_wrapper"](f)
    if path == "/hop":
        start_response("200 OK", [("Content-Type", "text/plain"), ("Connection", "close")])
        return [b"never"]
    return _router(environ, start_response)


FILE_DATA = _FILE_DATA
