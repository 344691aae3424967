"""A FastAPI app with WebSockets, for the real-client tests (tests/asgi/test_websocket_clients.py).

Serve it with refork (``refork --chdir tests apps.ws_fastapi:app``) or uvicorn
(``uvicorn --app-dir tests apps.ws_fastapi:app``):

- ``/ws/echo``: echo (protocol in ws_shared.py: ``close CODE REASON``, subprotocols, ``?tag=``);
- ``/ws/room``: broadcast: each text message from one client goes to every client connected to the
  room *of this worker process*, the sender included (as ``{"event": "message", "text": ...}``);
  on joining, a client first gets ``{"event": "joined"}`` once it is in the room. The room is in
  the process's memory: with several workers, clients on different workers are in different rooms
  (a broadcast across workers needs a channel layer such as Redis);
- ``/ws/deny``: closes before accepting (the server must answer the upgrade with 403);
- ``/ws/deny-body``: refuses with its own HTTP response (401 "custom denial", the ASGI denial
  response extension);
- ``/``: the browser page (ws_shared.PAGE), ``/report``: where the page reports, ``/closes?tag=``.
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from apps import ws_shared

app = FastAPI()

room: set[WebSocket] = set()  # this worker's room


@app.get("/")
async def page() -> HTMLResponse:
    return HTMLResponse(ws_shared.PAGE)


@app.get("/report")
async def report(request: Request) -> PlainTextResponse:
    if ws_shared.record_report(dict(request.query_params)):
        return PlainTextResponse("ok")
    return PlainTextResponse("bad token", status_code=400)


@app.get("/closes")
async def closes(tag: str) -> JSONResponse:
    seen = ws_shared.read_close(tag)
    return JSONResponse(seen) if seen is not None else JSONResponse({"error": "not yet"}, status_code=404)


@app.websocket("/ws/echo")
async def echo(websocket: WebSocket) -> None:
    await websocket.accept(
        subprotocol=ws_shared.pick_subprotocol(websocket.scope.get("subprotocols", [])),
        headers=[ws_shared.ACCEPT_HEADER],
    )
    tag = websocket.query_params.get("tag")
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            ws_shared.record_close(tag, message)
            return
        text = message.get("text")
        if text is not None:
            command = ws_shared.parse_close_command(text)
            if command is not None:
                await websocket.close(code=command[0], reason=command[1])
                return
            if text == "!scope":
                text = json.dumps(ws_shared.scope_summary(websocket.scope))
            await websocket.send_text(text)
        else:
            await websocket.send_bytes(message.get("bytes") or b"")


@app.websocket("/ws/room")
async def chat_room(websocket: WebSocket) -> None:
    await websocket.accept()
    room.add(websocket)
    try:
        await websocket.send_text(json.dumps({"event": "joined"}))
        while True:
            text = await websocket.receive_text()
            out = json.dumps({"event": "message", "text": text})
            for member in list(room):
                try:
                    await member.send_text(out)
                except Exception:  # a member that went away: its own handler removes it
                    pass
    except WebSocketDisconnect:
        pass
    finally:
        room.discard(websocket)


@app.websocket("/ws/deny")
async def deny(websocket: WebSocket) -> None:
    await websocket.close(code=1008)


@app.websocket("/ws/deny-body")
async def deny_with_body(websocket: WebSocket) -> None:
    status, body = ws_shared.DENIAL
    await websocket.send_denial_response(PlainTextResponse(body, status_code=status))
