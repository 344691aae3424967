"""Drive a WebSocket test app (tests/apps/ws_fastapi.py, ws_channels.py) with the `websockets` client
and print ONE JSON summary of what happened; the same script against two servers serving the same
app must print the same summary (tests/asgi/test_websocket_clients.py runs it against refork and uvicorn).

    python tests/clients/ws_client.py http://127.0.0.1:8000 [--n 200]

What it does (any failure goes to "errors", the script still prints the summary and exits 1):
- echo: N text messages (non-ASCII among them) and N binary ones, sent while reading the echoes;
  then a 1 MB text message (multi-byte UTF-8), a 1 MB binary one, an empty text and an empty binary,
  fragmented text and binary messages; a ping from the client (the pong must come back);
- the handshake: the extensions the server accepted (names only: permessage-deflate's parameters
  are the server's choice), the app's extra accept header, subprotocol negotiation for several
  offers, and the parts of the ASGI scope the app saw that servers should agree on (``!scope``);
- broadcast: 3 clients join /ws/room, each sends one message, every client must get all three;
- closes: the app closes with 4000 "server bye" (the client sees that code and reason); the client
  closes with 4001 "client bye" (the app records the code and reason of its websocket.disconnect,
  read back over HTTP at /closes);
- /ws/deny closes before accepting: the HTTP status of the refused upgrade (403 expected);
  /ws/deny-body refuses with its own response (the denial response extension: 401 and its body);
- too_big: a message over the server's --ws-max-size (run the server with 2 MB: the test does) is
  refused with a close, 1009.
Needs the rooms of one worker process: run the server with one worker (see ws_fastapi.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

UNICODE = ["héllo wörld", "☃ snowman", "🚀🛰️ rockets", "中文字符", "עברית", "e\u0301 combining", "\u0000nul"]
BIG = 1 << 20


def text_payload(i: int) -> str:
    return f"text {i} {UNICODE[i % len(UNICODE)]} " + "x" * (i % 50)


def binary_payload(i: int) -> bytes:
    return bytes((i * 7 + j) & 0xFF for j in range(1 + i % 300))


def big_text() -> str:
    unit = "aé☃🚀"  # 1 + 2 + 3 + 4 bytes of UTF-8
    text = unit * (BIG // 10)
    return text + "a" * (BIG - len(text.encode()))


class Client:
    def __init__(self, base: str, n: int) -> None:
        self.http = base.rstrip("/")
        self.ws = "ws" + self.http[len("http") :]
        self.n = n
        self.errors: list[str] = []

    def check(self, ok: bool, what: str) -> bool:
        if not ok:
            self.errors.append(what)
        return ok

    def open(self, path: str, **kw: Any) -> Any:
        return connect(self.ws + path, max_size=4 * BIG, open_timeout=10, close_timeout=10, **kw)

    async def echo(self) -> dict[str, Any]:
        async with self.open("/ws/echo") as ws:
            extensions = ws.response.headers.get("Sec-WebSocket-Extensions", "")
            result: dict[str, Any] = {
                "extensions": sorted({e.split(";")[0].strip() for e in extensions.split(",") if e.strip()}),
                "subprotocol": ws.subprotocol,
                "accept_header": ws.response.headers.get("X-WS-App"),
            }
            result["text_ok"] = await self.pipelined(ws, [text_payload(i) for i in range(self.n)])
            result["binary_ok"] = await self.pipelined(ws, [binary_payload(i) for i in range(self.n)])
            result["unicode_ok"] = await self.pipelined(ws, UNICODE)
            big = big_text()
            result["big_text_ok"] = await self.pipelined(ws, [big])
            result["big_binary_ok"] = await self.pipelined(ws, [os.urandom(BIG)])
            result["empty_ok"] = await self.pipelined(ws, ["", b""])
            await ws.send(["frag", "ment", "ed ☃"])
            result["fragmented_text"] = await asyncio.wait_for(ws.recv(), 10)
            await ws.send([b"\x00\x01", b"", b"\xff"])
            result["fragmented_binary"] = list(await asyncio.wait_for(ws.recv(), 10))
            pong = await ws.ping(b"refork")
            await asyncio.wait_for(pong, 10)
            result["pong"] = True
        return result

    async def scope(self) -> dict[str, Any]:
        async with self.open("/ws/echo?x=1&y=%C3%A9", subprotocols=["chat.v1", "other"]) as ws:
            await ws.send("!scope")
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    async def pipelined(self, ws: ClientConnection, messages: list[str] | list[bytes] | list[Any]) -> int:
        """Send every message while reading the echoes; the number echoed back identical, in order."""

        async def send_all() -> None:
            for message in messages:
                await ws.send(message)

        sender = asyncio.create_task(send_all())
        matched = 0
        try:
            for i, message in enumerate(messages):
                got = await asyncio.wait_for(ws.recv(), 20)
                if self.check(got == message and type(got) is type(message), f"echo #{i} differs"):
                    matched += 1
        finally:
            await sender
        return matched

    async def subprotocols(self) -> dict[str, Any]:
        result = {}
        for offer in (["chat.v1"], ["chat.v2", "chat.v1"], ["chat.v1", "chat.v2"], ["unknown"]):
            async with self.open("/ws/echo", subprotocols=offer) as ws:
                result[",".join(offer)] = ws.subprotocol
                await ws.send("ping")
                self.check(await ws.recv() == "ping", f"echo after offering {offer}")
        return result

    async def broadcast(self) -> list[list[str]]:
        clients = []
        try:
            for _ in range(3):
                ws = await self.open("/ws/room")
                clients.append(ws)
                self.check(json.loads(await ws.recv()) == {"event": "joined"}, "joined first")
            received: list[list[str]] = [[] for _ in clients]
            for k, sender in enumerate(clients):
                await sender.send(f"from client {k} ☃")
                for j, ws in enumerate(clients):
                    event = json.loads(await asyncio.wait_for(ws.recv(), 10))
                    received[j].append(event["text"] if event.get("event") == "message" else repr(event))
            return received
        finally:
            for ws in clients:
                await ws.close()

    async def server_close(self) -> dict[str, Any]:
        async with self.open("/ws/echo") as ws:
            await ws.send("close 4000 server bye")
            try:
                await asyncio.wait_for(ws.recv(), 10)
                self.check(False, "a message instead of the server's close")
            except ConnectionClosed:
                pass
            await ws.wait_closed()
            return {"code": ws.close_code, "reason": ws.close_reason}

    async def client_close(self) -> dict[str, Any] | None:
        tag = f"c{os.getpid()}-{time.monotonic_ns()}"
        async with self.open(f"/ws/echo?tag={tag}") as ws:
            await ws.send("before close")
            self.check(await ws.recv() == "before close", "echo before the client's close")
            await ws.close(4001, "client bye")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the app records its websocket.disconnect
            try:
                with urllib.request.urlopen(f"{self.http}/closes?tag={tag}", timeout=5) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as e:
                if e.code != 404:
                    raise
            await asyncio.sleep(0.05)
        self.check(False, "the app never recorded the client's close")
        return None

    async def deny(self) -> dict[str, Any]:
        result = {}
        for path in ("/ws/deny", "/ws/deny-body"):
            try:
                async with self.open(path):
                    self.check(False, f"{path} accepted")
                    result[path] = {"status": 101}
            except InvalidStatus as e:
                result[path] = {"status": e.response.status_code}
                if path == "/ws/deny-body":  # the app's body (a server's own 403 body is its choice)
                    result[path]["body"] = (e.response.body or b"").decode()
        return result

    async def too_big(self) -> dict[str, Any]:
        async with self.open("/ws/echo") as ws:
            try:
                await ws.send(os.urandom(3 * BIG))  # random: deflate cannot shrink it
                got = await asyncio.wait_for(ws.recv(), 10)
                self.check(False, f"a {len(got)}-byte echo of a message over --ws-max-size")
            except ConnectionClosed:
                pass
            await ws.wait_closed()
            return {"code": ws.close_code}

    async def run(self) -> dict[str, Any]:
        summary: dict[str, Any] = {"n": self.n}
        steps = (
            "echo",
            "scope",
            "subprotocols",
            "broadcast",
            "server_close",
            "client_close",
            "deny",
            "too_big",
        )
        for name in steps:
            try:
                summary[name] = await asyncio.wait_for(getattr(self, name)(), 60)
            except Exception as e:  # noqa: BLE001 - reported in the summary
                summary[name] = None
                self.errors.append(f"{name}: {type(e).__name__}: {e}")
        summary["errors"] = self.errors
        return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--n", type=int, default=1000, help="text and binary messages to echo (each)")
    args = parser.parse_args()
    summary = asyncio.run(Client(args.url, args.n).run())
    print(json.dumps(summary, sort_keys=True, ensure_ascii=False))
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
