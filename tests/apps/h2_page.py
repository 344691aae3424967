"""A page for real browsers and nghttp over HTTP/2 (tests/serving/test_http2_clients.py), as ASGI
(`app`) and WSGI (`wsgi_app`): `/` is an HTML page whose script fetches `/r/0` .. `/r/{n-1}` at
once and posts what it saw to `/report`; `/r/<i>` says which protocol and which client connection
(its port) the app saw, and how long a body it got; `/report` writes its body to
REPORT_DIR/report-<token>.json."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

REPORT_DIR = os.environ.get("REPORT_DIR", "")

PAGE = b"""<!doctype html><html><head><title>h2</title></head><body><pre id="out">waiting</pre>
<script>
const q = new URLSearchParams(location.search);
const n = Number(q.get("n") || "50"), token = q.get("token") || "";
async function run() {
  let report;
  try {
    const answers = await Promise.all(
      Array.from({length: n}, (_, i) => fetch("/r/" + i, {cache: "no-store"}).then(r => r.json())));
    const protocols = performance.getEntriesByType("resource")
      .filter(e => e.name.includes("/r/")).map(e => e.nextHopProtocol);
    report = {n, answers, protocols, page: performance.getEntriesByType("navigation")[0].nextHopProtocol};
  } catch (e) {
    report = {error: String(e)};
  }
  await fetch("/report?token=" + token, {method: "POST", body: JSON.stringify(report)});
  document.getElementById("out").textContent = "done";
}
run();
</script></body></html>"""


def _answer(index: str, protocol: str, port: int, body: bytes) -> bytes:
    what = {"i": int(index), "protocol": protocol, "port": port, "pid": os.getpid(), "body": len(body)}
    return json.dumps(what).encode()


def _report(query: str, body: bytes) -> None:
    token = parse_qs(query).get("token", ["none"])[0]
    path = os.path.join(REPORT_DIR, f"report-{token}.json")
    with open(path + ".part", "wb") as f:
        f.write(body)
    os.replace(path + ".part", path)  # whole or absent, for the test that polls for it


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    path = scope["path"]
    kind = b"application/json"
    if path.startswith("/r/"):
        out = _answer(path[3:], f"HTTP/{scope['http_version']}", scope["client"][1], body)
    elif path == "/report":
        _report(scope["query_string"].decode(), body)
        out = b"thanks"
    else:
        out, kind = PAGE, b"text/html; charset=utf-8"
    headers = [(b"content-type", kind), (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def wsgi_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    path = environ["PATH_INFO"]
    body = environ["wsgi.input"].read()
    kind = "application/json"
    if path.startswith("/r/"):
        out = _answer(path[3:], environ["SERVER_PROTOCOL"], int(environ["REMOTE_PORT"]), body)
    elif path == "/report":
        _report(environ["QUERY_STRING"], body)
        out = b"thanks"
    else:
        out, kind = PAGE, "text/html; charset=utf-8"
    start_response("200 OK", [("Content-Type", kind), ("Content-Length", str(len(out)))])
    return [out]
