"""gunicorn's pre_request(worker, req) and post_request(worker, req, environ, resp), on every path.

A config file's hooks write what they received (as JSON lines) to a file; requests go to refork on
each request path (the Python WSGI loop with 1 and 4 threads, the native engine and pool, ASGI on
asyncio and uvloop): gunicorn's shapes (req.method, .path, .query, .uri, .version, .headers with
upper-cased names, .remote_addr; resp.status, .status_code, .headers, .response_length, .sent),
the same `req` in both hooks, a pre_request that raises answered 500 without the app, a
post_request that raises logged, the access log still written, a streamed response too.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import read_to_end
from support.request_paths import OVER_TLS, PATHS, connect, flags

HOOKS = """
import json, os

def _note(**fields):
    with open({log!r}, "a") as f:
        f.write(json.dumps(fields) + "\\n")

def pre_request(worker, req):
    req.seen_at = 1.5  # a hook keeps what it measured on req: post_request reads it back
    _note(hook="pre", pid=worker.pid, me=os.getpid(), method=req.method, path=req.path, query=req.query,
          uri=req.uri, version=list(req.version), headers=req.headers, remote=list(req.remote_addr or ()),
          scheme=req.scheme, close=req.should_close())
    if req.path == "/fail-pre":
        raise RuntimeError("pre_request refuses it")

def post_request(worker, req, environ, resp):
    _note(hook="post", path=req.path, seen_at=getattr(req, "seen_at", None), method=environ["REQUEST_METHOD"],
          status=resp.status, code=resp.status_code, headers=resp.headers, length=resp.response_length,
          sent=resp.sent)
    if req.path == "/fail-post":
        raise RuntimeError("post_request is broken")
"""



def _send(path: str, port: int, raw: bytes) -> bytes:
    with connect(path, port) as sock:
        sock.sendall(raw)
        return read_to_end(sock)


def _notes(path, count: int) -> list[dict]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(f"{count} notes expected: {path.read_text() if path.exists() else 'none'}")


@pytest.mark.parametrize("path", list(PATHS))
def test_pre_and_post_request(path, start_server, tmp_path):
    interface = PATHS[path][0]
    args, app = flags(path, "apps.access_apps")
    notes = tmp_path / "notes.jsonl"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(HOOKS.format(log=str(notes)))
    access = tmp_path / "access.log"
    server = start_server("-c", str(conf), *args, "--access-logfile", str(access), "--access-logformat",
                          "%(s)s %(U)s", app=app, workers=1)  # fmt: skip
    head = b"GET /missing/a%20b?x=1 HTTP/1.1\r\nHost: h\r\nX-Thing: yes\r\nConnection: close\r\n\r\n"
    reply = _send(path, server.port, head)
    assert reply.startswith(b"HTTP/1.1 404 ")
    pre, post = _notes(notes, 2)
    worker = server.workers()[0]["pid"]
    assert pre["pid"] == pre["me"] == worker
    expected_path = "/missing/a b" if interface == "asgi" else "/missing/a%20b"  # (gunicorn's asgi: decoded)
    assert (pre["method"], pre["path"], pre["query"]) == ("GET", expected_path, "x=1")
    assert pre["uri"] == "/missing/a%20b?x=1"
    assert pre["version"] == [1, 1] and pre["close"] is True
    assert pre["scheme"] == ("https" if path in OVER_TLS else "http")
    assert pre["headers"] == [["HOST", "h"], ["X-THING", "yes"], ["CONNECTION", "close"]]
    assert pre["remote"][0] == "127.0.0.1" and isinstance(pre["remote"][1], int)
    headers = [["Content-Type", "text/plain"], ["Content-Length", "10"]]
    if interface == "asgi":  # the app's headers, as it sent them
        headers = [[name.lower(), value] for name, value in headers]
    assert post == {
        "hook": "post", "path": expected_path, "seen_at": 1.5, "method": "GET", "status": "404 Not Found",
        "code": 404, "headers": headers, "length": 10, "sent": 10,
    }  # fmt: skip

    # pre_request raises: 500, the app is not called (it would have answered 200)
    reply = _send(path, server.port, b"GET /fail-pre HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 500 ")
    notes3 = _notes(notes, 4)
    assert (notes3[2]["hook"], notes3[3]["hook"], notes3[3]["code"]) == ("pre", "post", 500)
    # post_request raises: logged, the response was sent, the next request is served
    reply = _send(path, server.port, b"GET /fail-post HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 ")
    server.wait_for(lambda: "Exception in post_request hook" in server.log(), what="the hook's error line")
    assert "RuntimeError: post_request is broken" in server.log()
    # a streamed body (chunked): post_request once it is all out
    reply = _send(path, server.port, b"GET /stream HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    assert reply.endswith(b"0\r\n\r\n")
    last = _notes(notes, 8)[-1]
    assert (last["hook"], last["path"], last["code"]) == ("post", "/stream", 200)
    assert (last["sent"], last["length"]) == (14, None)
    lines = access.read_text().splitlines()
    assert lines == ["404 /missing/a b", "500 /fail-pre", "200 /fail-post", "200 /stream"]


def test_only_post_request(start_server, tmp_path):
    """A config file with post_request alone: req is made all the same."""
    notes = tmp_path / "notes.jsonl"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(HOOKS.format(log=str(notes)).replace("def pre_request", "def _unused_pre_request"))
    server = start_server("-c", str(conf), app="apps.access_apps:wsgi", workers=1)
    assert server.get("/")[0] == 200
    (post,) = _notes(notes, 1)
    assert (post["hook"], post["path"], post["seen_at"], post["code"]) == ("post", "/", None, 200)
