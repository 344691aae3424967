"""What the two WebSocket test apps (ws_fastapi.py, ws_channels.py) share: the browser page and the
files through which they report to the tests.

``WS_STATE_DIR`` (env): the directory the apps write their reports to (``report-TOKEN.json`` from the
page, ``close-TAG.json`` when a tagged echo connection ends). It is a directory, not memory, because
the server may run several worker processes and the test process reads the files. Without the
variable the apps use a directory of their own, made at import (before a pre-fork server forks).

The echo protocol of ``/ws/echo`` (both apps):
- text is echoed as text and bytes as bytes, except two commands: ``close CODE REASON`` (the app
  closes the connection with that code and reason) and ``!scope`` (the app answers the JSON of
  ``scope_summary``: the parts of its ASGI scope two servers should agree on);
- the app picks the first subprotocol the client offers among ``SUBPROTOCOLS`` and accepts with the
  extra header ``ACCEPT_HEADER``;
- ``?tag=T``: when the connection ends, the app writes ``close-T.json`` with the code and reason of
  the ``websocket.disconnect`` it received; ``GET /closes?tag=T`` answers it (404 until then).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

SUBPROTOCOLS = ("chat.v2", "chat.v1")
ACCEPT_HEADER = (b"x-ws-app", b"echo")
DENIAL = (401, b"custom denial")  # /ws/deny-body: the denial response extension

STATE_DIR = Path(os.environ.get("WS_STATE_DIR") or tempfile.mkdtemp(prefix="ws-apps-"))

_SAFE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def pick_subprotocol(offered: list[str]) -> str | None:
    for name in offered:
        if name in SUBPROTOCOLS:
            return name
    return None


def parse_close_command(text: str) -> tuple[int, str] | None:
    """``close 4000 some reason`` -> (4000, "some reason"); anything else -> None."""
    if not text.startswith("close "):
        return None
    _, code, *reason = text.split(" ", 2)
    return int(code), (reason[0] if reason else "")


def scope_summary(scope: dict[str, Any]) -> dict[str, Any]:
    """What of a websocket scope the tests compare between servers (the client being the same)."""

    def text(value: Any) -> Any:
        return value.decode("latin-1") if isinstance(value, bytes) else value

    def address(value: Any) -> bool:
        return isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[1], int)

    return {
        "type": scope["type"],
        "asgi_version": scope.get("asgi", {}).get("version"),
        "spec_version": scope.get("asgi", {}).get("spec_version"),
        "scheme": scope.get("scheme"),
        "http_version": scope.get("http_version"),
        "path": scope.get("path"),
        "raw_path": text(scope.get("raw_path")),
        "query_string": text(scope.get("query_string")),
        "root_path": scope.get("root_path"),
        "subprotocols": list(scope.get("subprotocols", [])),
        "header_names": sorted(text(name) for name, _ in scope.get("headers", [])),
        "client_is_address": address(scope.get("client")),
        "server_is_address": address(scope.get("server")),
        "extensions": sorted(scope.get("extensions") or {}),
    }


def _write(name: str, data: dict[str, Any]) -> None:
    tmp = STATE_DIR / f".{name}.tmp{os.getpid()}"
    tmp.write_text(json.dumps(data))
    tmp.replace(STATE_DIR / name)  # atomic: a reader never sees half a file


def record_close(tag: str | None, message: dict[str, Any]) -> None:
    if tag and _SAFE.match(tag):
        _write(f"close-{tag}.json", {"code": message.get("code"), "reason": message.get("reason") or ""})


def read_close(tag: str) -> dict[str, Any] | None:
    if not _SAFE.match(tag):
        return None
    try:
        return json.loads((STATE_DIR / f"close-{tag}.json").read_text())
    except FileNotFoundError:
        return None


def record_report(params: dict[str, str]) -> bool:
    token = params.get("token", "")
    if not _SAFE.match(token):
        return False
    _write(f"report-{token}.json", {**params, "pid": os.getpid()})
    return True


# The browser page: one WebSocket to /ws/echo, N messages (default 1,000; every 10th binary, the
# text ones with non-ASCII characters) sent at once, each echo checked in order, then a close with
# 1000 and the result fetched to /report?token=...&ok=...: the test waits for that request, which
# proves the whole round trip (page served, upgrade, echoes, a new HTTP request). The result also
# goes to document.title.
PAGE = r"""<!doctype html>
<html><head><meta charset="utf-8"><title>pending</title></head>
<body><pre id="log"></pre>
<script>
"use strict";
const params = new URLSearchParams(location.search);
const n = Number(params.get("n") || 1000);
const token = params.get("token") || "none";
const scheme = location.protocol === "https:" ? "wss:" : "ws:";
const expected = [];
let ok = 0, bad = 0, binary = 0, received = 0, reported = false;
function payload(i) {
  if (i % 10 === 9) {
    const b = new Uint8Array(64 + i % 200);
    for (let j = 0; j < b.length; j++) b[j] = (i * 31 + j) & 255;
    return b;
  }
  return "message " + i + " \u00e9\u00e8 \u2603 \ud83d\ude80 " + "x".repeat(i % 100);
}
function same(a, b) {
  if (typeof a === "string") return a === b;
  if (!(b instanceof ArrayBuffer)) return false;
  const v = new Uint8Array(b);
  if (v.length !== a.length) return false;
  for (let j = 0; j < v.length; j++) if (v[j] !== a[j]) return false;
  return true;
}
function report(extra) {
  if (reported) return;
  reported = true;
  const q = new URLSearchParams(Object.assign({token: token, n: String(n), ok: String(ok),
    bad: String(bad), binary: String(binary)}, extra));
  document.title = "done " + q.toString();
  document.getElementById("log").textContent = q.toString();
  fetch("/report?" + q.toString()).catch(() => {});
}
const ws = new WebSocket(scheme + "//" + location.host + "/ws/echo");
ws.binaryType = "arraybuffer";
ws.onopen = () => {
  for (let i = 0; i < n; i++) {
    const p = payload(i);
    expected.push(p);
    ws.send(p);
  }
};
ws.onmessage = (event) => {
  const want = expected[received++];
  if (same(want, event.data)) {
    ok++;
    if (typeof want !== "string") binary++;
  } else {
    bad++;
  }
  if (received === n) ws.close(1000, "done");
};
ws.onclose = (event) => report({close: String(event.code), clean: String(event.wasClean),
  extensions: ws.extensions, protocol: ws.protocol});
ws.onerror = () => report({error: "1"});
</script></body></html>
"""
