"""WebSocket echo, a plain ASGI app, for benchmarks/websocket.py (issue 11).

websocket: accept, then send every text or bytes message back as it came, until the client leaves.
http: 200 "ok" (the benchmark's readiness probe). lifespan: complete at once.
"""

from collections.abc import Awaitable, Callable

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]

OK_HEADERS = [(b"content-type", b"text/plain"), (b"content-length", b"2")]


async def app(scope: dict, receive: Receive, send: Send) -> None:
    kind = scope["type"]
    if kind == "websocket":
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.receive":
                if message.get("text") is not None:
                    await send({"type": "websocket.send", "text": message["text"]})
                else:
                    await send({"type": "websocket.send", "bytes": message.get("bytes") or b""})
            elif message["type"] == "websocket.disconnect":
                return
    elif kind == "http":
        await send({"type": "http.response.start", "status": 200, "headers": OK_HEADERS})
        await send({"type": "http.response.body", "body": b"ok"})
    elif kind == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
