"""Plain-ASGI WebSocket apps for tests/test_websocket*.py (no framework).

`app` routes by path:

- /echo            accept, echo every message (text as text, bytes as bytes)
- /proto           accept with the first offered subprotocol and an extra header
- /scope           accept, send the scope (JSON-able parts) as one text message, close
- /deny            denial response: 401 with a body (websocket.http.response.*)
- /refuse          websocket.close before accept: 403
- /return          return before accept: 403
- /raise           raise before accept: 500
- /close?code=&reason=  accept, then close with that code and reason
- /after-close     accept, close, then send again (a RuntimeError the log shows)
- /flood?size=     accept, send `size`-byte messages forever; /count reports how many sent
- /count           accept, send the flood's count, close
- /linger          accept; on websocket.disconnect keep running 60 s (a stop must not wait for it)
- /broadcast       every message to every open /broadcast connection
- /pid             accept, send os.getpid(), then echo
- /sleepy?sleep=   accept, receive nothing for `sleep` seconds, then report how many it received

Each disconnect the app sees is appended to $WS_APP_LOG as "PATH CODE REASON" (if set).
Any http request gets 200 "http PATH" (for --ws none and plain requests).
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any
from urllib.parse import parse_qs

FLOOD = {"sent": 0}
ROOMS: set[Any] = set()


def _record(path: str, message: dict[str, Any]) -> None:
    target = os.environ.get("WS_APP_LOG")
    if target:
        with open(target, "a") as f:
            f.write(f"{path} {message.get('code')} {message.get('reason', '')}\n")


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    path = scope["path"]
    if scope["type"] == "http":
        body = f"http {path} upgrade={dict(scope['headers']).get(b'upgrade', b'').decode()}".encode()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": body})
        return
    assert scope["type"] == "websocket"
    query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    connect = await receive()
    assert connect["type"] == "websocket.connect"
    handler = ROUTES.get(path, echo)
    await handler(scope, receive, send, query)


async def _loop(path: str, receive: Any, on_message: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            _record(path, message)
            return
        await on_message(message)


async def echo(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})

    async def reply(message: dict[str, Any]) -> None:
        await send({"type": "websocket.send", "bytes": message.get("bytes"), "text": message.get("text")})

    await _loop(scope["path"], receive, reply)


async def proto(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    offered = scope["subprotocols"]
    await send(
        {"type": "websocket.accept", "subprotocol": offered[0] if offered else None,
         "headers": [(b"x-extra", b"yes")]}
    )  # fmt: skip
    await echo_loop(scope, receive, send)


async def echo_loop(scope: dict[str, Any], receive: Any, send: Any) -> None:
    async def reply(message: dict[str, Any]) -> None:
        await send({"type": "websocket.send", "bytes": message.get("bytes"), "text": message.get("text")})

    await _loop(scope["path"], receive, reply)


async def scope_(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    shown = {
        k: v
        for k, v in scope.items()
        if k not in ("headers", "raw_path", "query_string", "state", "extensions")
    }
    shown["extensions"] = sorted(scope.get("extensions") or {})
    shown["has_state"] = "state" in scope
    shown["headers"] = [[k.decode(), v.decode()] for k, v in scope["headers"]]
    await send({"type": "websocket.send", "text": json.dumps(shown)})
    await send({"type": "websocket.close"})


async def deny(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.http.response.start", "status": 401,
                "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})  # fmt: skip
    await send({"type": "websocket.http.response.body", "body": b"no ", "more_body": True})
    await send({"type": "websocket.http.response.body", "body": b"token"})


async def refuse(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.close", "code": 4003})


async def return_(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    return


async def raise_(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    raise ValueError("the app failed before accepting")


async def close(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    await send(
        {"type": "websocket.close", "code": int(query.get("code", 1000)), "reason": query.get("reason", "")}
    )
    message = await receive()
    _record(scope["path"], message)


async def after_close(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close"})
    await send({"type": "websocket.send", "text": "too late"})


async def flood(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    chunk = b"x" * int(query.get("size", 16384))
    FLOOD["sent"] = 0
    while True:
        await send({"type": "websocket.send", "bytes": chunk})
        FLOOD["sent"] += 1


async def count(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": str(FLOOD["sent"])})
    await send({"type": "websocket.close"})


async def linger(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    message = await receive()
    _record(scope["path"], message)
    await asyncio.sleep(60)  # ignores the disconnect: the worker must still exit in time


async def broadcast(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    ROOMS.add(send)

    async def fan_out(message: dict[str, Any]) -> None:
        for peer in list(ROOMS):
            try:
                await peer(
                    {"type": "websocket.send", "text": message.get("text"), "bytes": message.get("bytes")}
                )
            except OSError:
                ROOMS.discard(peer)

    try:
        await _loop(scope["path"], receive, fan_out)
    finally:
        ROOMS.discard(send)


async def pid(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": str(os.getpid())})
    await echo_loop(scope, receive, send)


async def sleepy(scope: dict[str, Any], receive: Any, send: Any, query: dict[str, str]) -> None:
    await send({"type": "websocket.accept"})
    await asyncio.sleep(float(query.get("sleep", 3)))
    received = 0
    while (await receive())["type"] == "websocket.receive":
        received += 1
        if received == int(query.get("expect", 0)):
            await send({"type": "websocket.send", "text": f"received {received}"})


ROUTES = {
    "/sleepy": sleepy,
    "/echo": echo,
    "/proto": proto,
    "/scope": scope_,
    "/deny": deny,
    "/refuse": refuse,
    "/return": return_,
    "/raise": raise_,
    "/close": close,
    "/after-close": after_close,
    "/flood": flood,
    "/count": count,
    "/linger": linger,
    "/broadcast": broadcast,
    "/pid": pid,
}
