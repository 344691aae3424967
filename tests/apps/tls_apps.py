"""Apps for tests/serving/test_tls.py: the scheme the server says, echo of a body, a big download, the
ASGI `tls` extension."""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any

_BLOCK = bytes(range(256)) * 256  # 64 KiB


def _big(n: int) -> list[bytes]:
    out = [_BLOCK] * (n // len(_BLOCK))
    if n % len(_BLOCK):
        out.append(_BLOCK[: n % len(_BLOCK)])
    return out


def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    path = environ["PATH_INFO"]
    if path == "/echo":
        body = environ["wsgi.input"].read()
        out = f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
    elif path == "/big":
        n = int(environ["QUERY_STRING"] or "0")
        start_response("200 OK", [("Content-Type", "application/octet-stream"), ("Content-Length", str(n))])
        return _big(n)
    elif path == "/slow":
        time.sleep(float(environ["QUERY_STRING"] or "1"))
        out = b"slow"
    else:
        out = f"{environ['wsgi.url_scheme']} {os.getpid()} {environ['PATH_INFO']}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(out)))])
    return [out]


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    headers = [(b"content-type", b"text/plain")]
    if path == "/echo":
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        out = f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
    elif path == "/big":
        n = int(scope["query_string"] or b"0")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(n).encode())]})  # fmt: skip
        for block in _big(n):
            await send({"type": "http.response.body", "body": block, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    elif path == "/tls":  # the `tls` scope extension (absent on a plain connection)
        out = json.dumps(scope["extensions"].get("tls")).encode()
    else:
        out = f"{scope['scheme']} {os.getpid()} {path}".encode()
    headers.append((b"content-length", str(len(out)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})
