"""The same three routes as WSGI and ASGI, for the connection-contract tests.

``/`` answers the worker's pid, ``/echo`` reads the whole body and echoes it, ``/big?N`` sends
N bytes in one body (default 32 MB: more than the kernel buffers of both ends hold).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

BIG = 32 << 20


def _route(path: str, query: str, body: Callable[[], bytes]) -> bytes:
    if path == "/echo":
        return body()
    if path == "/big":
        return b"x" * int(query or BIG)
    return str(os.getpid()).encode()


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    data = _route(environ["PATH_INFO"], environ["QUERY_STRING"], environ["wsgi.input"].read)
    start_response("200 OK", [("Content-Length", str(len(data)))])
    return [data]


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    if scope["path"] == "/echo":
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
    data = _route(scope["path"], scope["query_string"].decode(), lambda: body)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(data)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": data})
