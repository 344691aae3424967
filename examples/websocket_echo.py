"""A WebSocket echo in plain ASGI, with a page to try it. Run:

    refork --chdir examples -w 2 websocket_echo:app

then open http://127.0.0.1:8000/ (or: python -m websockets ws://127.0.0.1:8000/ws). Stop refork
with Ctrl-C and the page shows the close code the server sent: 1001 (going away); `kill -HUP` the
monitor instead and it shows 1012 (service restart) as the worker is replaced.
"""

from __future__ import annotations

from typing import Any

PAGE = b"""<!doctype html>
<meta charset="utf-8">
<title>refork WebSocket echo</title>
<form id="f"><input id="msg" value="hello" autofocus> <button>send</button></form>
<pre id="log"></pre>
<script>
const log = (line) => document.getElementById("log").textContent += line + "\\n";
const ws = new WebSocket(`ws://${location.host}/ws`);
ws.onopen = () => log("open");
ws.onmessage = (e) => log("echo: " + e.data);
ws.onclose = (e) => log(`closed: ${e.code} ${e.reason}`);
document.getElementById("f").onsubmit = (e) => {
  e.preventDefault();
  ws.send(document.getElementById("msg").value);
};
</script>
"""


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8")]})  # fmt: skip
        await send({"type": "http.response.body", "body": PAGE})
    elif scope["type"] == "websocket":
        await receive()  # websocket.connect
        if scope["path"] != "/ws":
            await send({"type": "websocket.close"})  # refused: the client sees HTTP 403
            return
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return  # message["code"]: 1000, 1001 (the server stops), 1012 (a reload)...
            await send({"type": "websocket.send", "text": message.get("text"), "bytes": message.get("bytes")})
