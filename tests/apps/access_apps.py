"""One small app as WSGI (`wsgi`) and ASGI (`asgi`) with the same responses, for the access-log,
StatsD and PROXY protocol tests: a path picks the response (status, headers, a body whole or
streamed; /boom raises; /peer says "ADDRESS PORT SCHEME" of the client); anything else is 200."""

from __future__ import annotations

HEADERS = [("Content-Type", "text/plain"), ("X-Quote", 'say "hi" \\ bye')]


def _answer(path: str) -> tuple[int, list[tuple[str, str]], list[bytes]]:
    """(status, headers, body parts) for a path; no Content-Length on /stream (chunked)."""
    if path.startswith("/boom"):
        raise RuntimeError("boom on purpose")
    if path.startswith("/missing"):
        body = [b"not found\n"]
        return 404, [("Content-Type", "text/plain"), ("Content-Length", str(len(body[0])))], body
    if path.startswith("/stream"):
        return 200, list(HEADERS), [b"one,", b"two,", b"three\n"]
    if path.startswith("/empty"):
        return 204, [("X-Empty", "yes")], []
    body = [b"hello\n"]
    return 200, [*HEADERS, ("Content-Length", str(len(body[0])))], body


_REASONS = {200: "OK", 204: "No Content", 404: "Not Found"}


def _peer(address, port, scheme) -> tuple[list[tuple[str, str]], bytes]:
    body = f"{address} {port} {scheme}".encode()
    return [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))], body


def wsgi(environ, start_response):
    if environ["PATH_INFO"] == "/peer":
        scheme = environ["wsgi.url_scheme"]
        headers, body = _peer(environ["REMOTE_ADDR"], environ.get("REMOTE_PORT"), scheme)
        start_response("200 OK", headers)
        return [body]
    status, headers, parts = _answer(environ["PATH_INFO"])
    start_response(f"{status} {_REASONS[status]}", headers)
    if environ["PATH_INFO"].startswith("/stream"):
        return iter(parts)  # a generator-like body: the server frames it chunked
    return parts


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/peer":
        client = scope["client"] or (None, None)
        headers, body = _peer(client[0], client[1], scope["scheme"])
        raw = [(n.lower().encode(), v.encode()) for n, v in headers]
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": body})
        return
    status, headers, parts = _answer(scope["path"])
    raw = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part, "more_body": i < len(parts) - 1})
    if not parts:
        await send({"type": "http.response.body", "body": b""})
