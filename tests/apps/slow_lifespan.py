"""An ASGI app whose lifespan startup takes a second (a database pool being opened) and leaves a
mark file named after its pid when it is done."""

import asyncio
import os

MARK = os.environ.get("REFORK_TEST_MARK", "/tmp/refork-slow-lifespan-")


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await asyncio.sleep(1.0)
                with open(f"{MARK}{os.getpid()}", "w"):
                    pass
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
