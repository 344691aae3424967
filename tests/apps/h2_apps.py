"""Apps for the HTTP/2 tests (tests/serving/test_http2.py, tests/serving/test_h2spec.py): what the
request looked like to the app, a body echo, a big download, a stream that waits for
http.disconnect, a slow response, trailers, pathsend; `app` is ASGI, `wsgi_app` the same paths
over WSGI (those WSGI has: no trailers, pathsend or disconnect)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

_BLOCK = bytes(range(256)) * 256  # 64 KiB
EVENTS = os.environ.get("H2_EVENTS", "")  # a file the apps append what they saw to


def _note(line: str) -> None:
    if EVENTS:
        with open(EVENTS, "a") as f:
            f.write(line + "\n")


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client went away")
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    path, query = scope["path"], scope["query_string"].decode()
    headers = [(b"content-type", b"text/plain")]
    if path == "/echo":
        body = await _body(receive)
        out = f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
    elif path == "/big":
        n = int(query or "0")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(n).encode())]})  # fmt: skip
        while n > 0:
            chunk = _BLOCK[: min(n, len(_BLOCK))]
            n -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": n > 0})
        return
    elif path == "/wait-disconnect":
        _note(f"waiting {query}")
        message = await receive()
        while message["type"] != "http.disconnect":
            message = await receive()
        _note(f"disconnect {query}")
        return
    elif path == "/slow":
        _note(f"slow {query}")
        await asyncio.sleep(float(query or "1"))
        out = b"slow done"
    elif path == "/trailers":
        await send({"type": "http.response.start", "status": 200, "headers": headers, "trailers": True})
        await send({"type": "http.response.body", "body": b"with trailers", "more_body": False})
        await send({"type": "http.response.trailers", "headers": [(b"x-checksum", b"abc")]})
        return
    elif path == "/pathsend":
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.pathsend", "path": os.path.abspath(__file__)})
        return
    elif path == "/error":
        raise RuntimeError("boom (expected by the test)")
    else:
        await _body(receive)
        info = {"http_version": scope["http_version"], "scheme": scope["scheme"], "path": path,
                "host": dict(scope["headers"]).get(b"host", b"").decode(), "pid": os.getpid()}  # fmt: skip
        out = json.dumps(info).encode()
        headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200,
                "headers": [*headers, (b"content-length", str(len(out)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": out})


_lock = threading.Lock()
_calls = [0, 0]  # app calls now, the most at once


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
    path, query = environ["PATH_INFO"], environ["QUERY_STRING"]
    headers = [("Content-Type", "text/plain")]
    if path == "/echo":
        body = environ["wsgi.input"].read()
        out = f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
    elif path == "/big":
        n = int(query or "0")
        start_response("200 OK", [("Content-Length", str(n))])
        while n > 0:
            chunk = _BLOCK[: min(n, len(_BLOCK))]
            n -= len(chunk)
            yield chunk
        return
    elif path == "/slow":
        _note(f"slow {query}")
        time.sleep(float(query or "1"))
        out = b"slow done"
    elif path == "/error":
        raise RuntimeError("boom (expected by the test)")
    elif path == "/concurrent":  # the most app calls at once this worker has seen
        with _lock:
            _calls[0] += 1
            _calls[1] = max(_calls)
        time.sleep(0.3)
        with _lock:
            out = str(_calls[1]).encode()
            _calls[0] -= 1
    else:
        environ["wsgi.input"].read()
        protocol = environ["SERVER_PROTOCOL"]
        info = {"http_version": {"HTTP/2.0": "2"}.get(protocol, protocol[5:]), "path": path,
                "scheme": environ["wsgi.url_scheme"], "host": environ.get("HTTP_HOST", ""),
                "pid": os.getpid(),
                "server_protocol": protocol, "remote": environ.get("REMOTE_ADDR")}  # fmt: skip
        out = json.dumps(info).encode()
        headers = [("Content-Type", "application/json")]
    start_response("200 OK", [*headers, ("Content-Length", str(len(out)))])
    yield out
