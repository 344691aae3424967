"""Apps for --request-timeout and refork.extend_deadline(): a WSGI `app` and an ASGI `asgi`.

Each response body starts with the serving pid. Paths: / (at once), /slow?S (sleep S seconds),
/hang (forever, in `hang_forever`), /extend?S (extend by 30s, then sleep S), /deaf (forever with
SIGUSR2 blocked: no handler can run), and for ASGI /hang awaits while /block blocks the loop.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import refork

FOREVER = 1000.0


def hang_forever() -> None:
    time.sleep(FOREVER)


def block_the_loop() -> None:
    time.sleep(FOREVER)


def deaf_forever() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGTERM})
    time.sleep(FOREVER)


def app(environ, start_response):
    path, query = environ["PATH_INFO"], environ.get("QUERY_STRING") or "1"
    extra = b""
    if path == "/slow":
        time.sleep(float(query))
    elif path == "/hang":
        hang_forever()
    elif path == "/block":
        block_the_loop()
    elif path == "/deaf":
        deaf_forever()
    elif path == "/extend":
        extra = b" extended=%r" % refork.extend_deadline(30)
        time.sleep(float(query))
    body = str(os.getpid()).encode() + extra
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def hang_forever_async() -> None:
    await asyncio.sleep(FOREVER)


async def asgi(scope, receive, send):
    if scope["type"] != "http":
        return
    path, query = scope["path"], scope["query_string"].decode() or "1"
    extra = b""
    if path == "/slow":
        await asyncio.sleep(float(query))
    elif path == "/hang":
        await hang_forever_async()
    elif path == "/block":
        block_the_loop()
    elif path == "/extend":
        extra = b" extended=%r" % refork.extend_deadline(30)
        await asyncio.sleep(float(query))
    body = str(os.getpid()).encode() + extra
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})
