"""The app of the gunicorn-behaviour comparison: it answers with what it sees (the environ's or the
scope's sorted keys, selected values, raw_env's variable), as WSGI (`wsgi`) and ASGI (`asgi`)."""

from __future__ import annotations

import json
import os

VALUES = ("REQUEST_METHOD", "PATH_INFO", "QUERY_STRING", "SCRIPT_NAME", "SERVER_PROTOCOL", "HTTP_HOST",
          "REMOTE_ADDR", "SERVER_NAME", "SERVER_PORT", "wsgi.url_scheme", "wsgi.multiprocess",
          "wsgi.run_once", "wsgi.version")  # fmt: skip


def _body(seen: dict) -> bytes:
    return json.dumps({**seen, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE")}).encode()


def wsgi(environ, start_response):
    if environ["PATH_INFO"] == "/fixed":  # the same body from both servers: the same access line
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "6")])
        return [b"fixed\n"]
    values = {k: environ[k] if not isinstance(environ.get(k), tuple) else list(environ[k]) for k in VALUES
              if k in environ}  # fmt: skip
    body = _body({"keys": sorted(environ), "values": values})
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/fixed":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"6")]})
        await send({"type": "http.response.body", "body": b"fixed\n"})
        return
    values = {k: scope[k] for k in ("type", "http_version", "method", "scheme", "path", "query_string",
                                    "root_path") if k in scope}  # fmt: skip
    values["query_string"] = values.get("query_string", b"").decode()
    body = _body({"keys": sorted(scope), "values": values})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})
