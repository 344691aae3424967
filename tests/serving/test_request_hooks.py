"""gunicorn's pre_request(worker, req) and post_request(worker, req, environ, resp), on every path.

A config file's hooks write what they received (as JSON lines) to a file; requests go to refork on
each request path (tests/support/request_paths.py): gunicorn's shapes (req.method, .path, .query,
.uri, .version, .headers with upper-cased names, .remote_addr; resp.status, .status_code, .headers,
.response_length, .sent), the same `req` in both hooks, a pre_request that raises answered 500
without the app, a post_request that raises logged, the access log still written, a streamed
response too. On an HTTP/2 path the requests are streams of one HTTP/2 connection: the hooks run
for each stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager

import pytest
from conftest import read_to_end
from support.h2client import H2Client
from support.request_paths import OVER_TLS, PATHS, connect, flags, http2, tls

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



@contextmanager
def _client(path: str, port: int) -> Iterator[Callable[..., tuple[int, bytes]]]:
    """get(target, fields=()) -> (status, body as it came) as the path's clients send a GET: over
    HTTP/1.1 on a connection each (Connection: close; a streamed body comes chunked), over HTTP/2
    on streams of one connection (the hooks run per stream)."""
    if http2(path):
        with closing(H2Client(port, timeout=10, tls=tls(path))) as client:
            yield lambda target, fields=(): client.request("GET", target, fields=fields)
        return

    def get(target: str, fields: tuple[tuple[str, str], ...] = ()) -> tuple[int, bytes]:
        lines = "".join(f"{name}: {value}\r\n" for name, value in fields)
        head = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n{lines}Connection: close\r\n\r\n"
        with connect(path, port) as sock:
            sock.sendall(head.encode())
            reply = read_to_end(sock)
        assert reply.startswith(b"HTTP/1.1 "), reply
        return int(reply.split()[1]), reply.partition(b"\r\n\r\n")[2]

    yield get


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
    h2 = http2(path)
    with _client(path, server.port) as get:
        assert get("/missing/a%20b?x=1", (("x-thing", "yes"),))[0] == 404
        pre, post = _notes(notes, 2)
        worker = server.workers()[0]["pid"]
        assert pre["pid"] == pre["me"] == worker
        # (gunicorn's asgi: decoded)
        expected_path = "/missing/a b" if interface == "asgi" else "/missing/a%20b"
        assert (pre["method"], pre["path"], pre["query"]) == ("GET", expected_path, "x=1")
        assert pre["uri"] == "/missing/a%20b?x=1"
        # over HTTP/2 (no gunicorn to compare with): version 2.0, and a stream's end does not close
        # its connection; Host is the :authority, and there is no Connection field
        assert pre["version"] == ([2, 0] if h2 else [1, 1]) and pre["close"] is not h2
        assert pre["scheme"] == ("https" if path in OVER_TLS else "http")
        closing_field = [] if h2 else [["CONNECTION", "close"]]
        assert pre["headers"] == [["HOST", "127.0.0.1"], ["X-THING", "yes"], *closing_field]
        assert pre["remote"][0] == "127.0.0.1" and isinstance(pre["remote"][1], int)
        headers = [["Content-Type", "text/plain"], ["Content-Length", "10"]]
        if interface == "asgi":  # the app's headers, as it sent them
            headers = [[name.lower(), value] for name, value in headers]
        assert post == {
            "hook": "post", "path": expected_path, "seen_at": 1.5, "method": "GET", "status": "404 Not Found",
            "code": 404, "headers": headers, "length": 10, "sent": 10,
        }  # fmt: skip

        # pre_request raises: 500, the app is not called (it would have answered 200)
        assert get("/fail-pre")[0] == 500
        notes3 = _notes(notes, 4)
        assert (notes3[2]["hook"], notes3[3]["hook"], notes3[3]["code"]) == ("pre", "post", 500)
        # post_request raises: logged, the response was sent, the next request is served
        assert get("/fail-post")[0] == 200
        server.wait_for(lambda: "Exception in post_request hook" in server.log(), what="the hook's error")
        assert "RuntimeError: post_request is broken" in server.log()
        # a streamed body (chunked over HTTP/1.1): post_request once it is all out
        status, body = get("/stream")
        assert status == 200 and (body == b"one,two,three\n" if h2 else body.endswith(b"0\r\n\r\n"))
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


HANGING_POST = """
import time

def post_request(worker, req, environ, resp):
    if req.path == "/hang":
        time.sleep(3600)
"""


@pytest.mark.parametrize("path", list(PATHS))
def test_a_hanging_post_request_counts_as_its_request_time(path, start_server, tmp_path):
    """--timeout kills a worker stuck in post_request, as one stuck in the app."""
    args, app = flags(path, "apps.access_apps")
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(HANGING_POST)
    server = start_server("-c", str(conf), *args, "--timeout", "1", app=app, workers=1)
    victim = server.workers()[0]["pid"]
    with _client(path, server.port) as get:
        try:
            get("/hang")
        except Exception:  # noqa: S110 - the native pool answers after post_request: the kill ends it
            pass
    server.wait_for(lambda: f"(pid {victim}): timeout: busy longer than 1s" in server.log(), what="the kill")
    server.wait_for(lambda: [w for w in server.workers() if w["pid"] != victim], what="a replacement")
