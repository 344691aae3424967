"""ASGI over HTTP/1.1: the scope and the response state machine (unit), the warm-up, then requests
over real sockets: bodies, keep-alive and pipelining, chunked, 100-continue, HEAD and HTTP/1.0,
app errors (500) and clients that go away.
"""

from __future__ import annotations

import os
import socket
import threading

import pytest
from support.asgi_server import at_eof, exchange, read_response
from support.waits import wait_for_line

from refork.asgi import ResponseState, build_scope, decode_path
from refork.config import Config
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies
from refork.warmup import warm

# ---------------------------------------------------------------------------------------------
# Unit: scope


def _request(**kw) -> Request:
    base = dict(
        method="GET",
        target=b"/a%20b/%C3%A9?x=1",
        path=b"/a%20b/%C3%A9",
        query=b"x=1",
        http_version="1.1",
        headers=[
            (b"host", b"example.com"),
            (b"x-forwarded-proto", b"https"),
            (b"x-forwarded-for", b"9.9.9.9"),
        ],
    )
    base.update(kw)
    return Request(**base)


def test_build_scope_basics():
    scope = build_scope(_request(), server=("127.0.0.1", 8000), client=("10.0.0.1", 5555), state={"k": 1})
    assert scope["type"] == "http"
    assert scope["asgi"] == {"version": "3.0", "spec_version": "2.4"}
    assert scope["http_version"] == "1.1"
    assert scope["method"] == "GET"
    assert scope["path"] == "/a b/é"
    assert scope["raw_path"] == b"/a%20b/%C3%A9"
    assert scope["query_string"] == b"x=1"
    assert scope["root_path"] == ""
    assert scope["scheme"] == "http"  # no proxies configured: X-Forwarded-* ignored
    assert scope["client"] == ("10.0.0.1", 5555)
    assert scope["server"] == ("127.0.0.1", 8000)
    assert [list(h) for h in scope["headers"]][0] == [b"host", b"example.com"]
    assert scope["state"] == {"k": 1}


def test_build_scope_state_is_a_copy():
    state = {"k": 1}
    scope = build_scope(_request(), server=None, client=None, state=state)
    scope["state"]["k"] = 2
    assert state == {"k": 1}


def test_build_scope_forwarded_only_from_trusted_peer():
    """The connection checks its peer once and passes the proxies only when it trusts it."""
    proxies = TrustedProxies(["127.0.0.1"])
    trusted = build_scope(_request(), server=None, client=("127.0.0.1", 1), proxies=proxies)
    assert trusted["scheme"] == "https"
    assert trusted["client"][0] == "9.9.9.9"
    untrusted = build_scope(_request(), server=None, client=("10.1.1.1", 1), proxies=None)
    assert untrusted["scheme"] == "http"
    assert untrusted["client"] == ("10.1.1.1", 1)


def test_build_scope_root_path():
    scope = build_scope(_request(path=b"/x"), server=None, client=None, root_path="/app")
    assert scope["root_path"] == "/app"
    assert scope["path"] == "/app/x"
    assert scope["raw_path"] == b"/app/x"
    already = build_scope(_request(path=b"/app/x"), server=None, client=None, root_path="/app")
    assert already["path"] == "/app/x"


def test_decode_path_bad_utf8_does_not_raise():
    assert decode_path(b"/%FF") == "/\ufffd"
    assert decode_path(b"/plain") == "/plain"


# ---------------------------------------------------------------------------------------------
# Unit: response state machine


def _start(status=200, headers=None):
    return {"type": "http.response.start", "status": status, "headers": headers or []}


def test_response_head_is_joined_to_first_body():
    state = ResponseState(_request())
    assert state.feed(_start(headers=[(b"content-length", b"2")])) == b""
    out = state.feed({"type": "http.response.body", "body": b"hi"})
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(b"\r\n\r\nhi")
    assert state.complete and state.status == 200 and state.body_bytes == 2
    assert state.will_keep_alive


def test_response_chunked_stream():
    state = ResponseState(_request())
    state.feed(_start())
    first = state.feed({"type": "http.response.body", "body": b"abc", "more_body": True})
    assert b"transfer-encoding: chunked" in first.lower()
    assert first.endswith(b"3\r\nabc\r\n")
    assert state.feed({"type": "http.response.body", "body": b"", "more_body": True}) == b""
    assert state.feed({"type": "http.response.body"}) == b"0\r\n\r\n"
    assert state.complete


def test_response_head_request_has_no_body():
    state = ResponseState(_request(method="HEAD"))
    state.feed(_start(headers=[(b"content-length", b"5")]))
    out = state.feed({"type": "http.response.body", "body": b"hello"})
    assert out.endswith(b"\r\n\r\n") and b"hello" not in out


@pytest.mark.parametrize(
    "messages, error",
    [
        ([{"type": "http.response.body", "body": b"x"}], "http.response.start"),
        ([_start(), _start()], "http.response.body"),
        ([_start(), {"type": "http.response.body"}, {"type": "http.response.body"}], "completed"),
        ([{"status": 200}], "type"),
        ([_start(status="200")], "status"),
        ([_start(headers=[("a", "b")])], "bytes"),
        ([_start(headers=[(b"bad name", b"v")])], "head"),
        ([_start(), {"type": "http.response.body", "body": "str"}], "bytes"),
    ],
)
def test_response_order_and_type_errors(messages, error):
    state = ResponseState(_request())
    with pytest.raises(RuntimeError, match=error):
        for message in messages:
            state.feed(message)


@pytest.mark.parametrize("value", [b"a\x0bb", b"a\x7f", b"\x01", b"a\r\nX-Injected: 1", b"a\x00"])
def test_response_header_value_with_a_control_character_is_an_app_error(value):
    state = ResponseState(_request())
    with pytest.raises(RuntimeError, match="head"):
        state.feed(_start(headers=[(b"x-bad", value)]))


@pytest.mark.parametrize("value", [b"close", b"Close", b"keep-alive, close"])
def test_response_app_connection_close_is_honoured(value):
    state = ResponseState(_request())
    out = state.feed(_start(headers=[(b"connection", value), (b"content-length", b"2")]))
    out += state.feed({"type": "http.response.body", "body": b"hi"})
    head = out.partition(b"\r\n\r\n")[0].lower()
    assert head.count(b"connection:") == 1 and b"\r\nconnection: close" in head
    assert state.complete and not state.will_keep_alive


def test_response_keep_alive_can_be_withdrawn_before_start():
    state = ResponseState(_request())
    state.keep_alive = False
    out = state.feed(_start(headers=[(b"content-length", b"0")])) + state.feed({"type": "http.response.body"})
    assert b"connection: close" in out.lower()
    assert not state.will_keep_alive


# ---------------------------------------------------------------------------------------------
# Unit: warm-up


def test_warmup_asgi_leaves_no_thread_or_loop():
    from apps import asgi_apps

    before = threading.active_count()
    results = warm(asgi_apps.app, "asgi", ["/", "/raise", "/noresponse", "/scope?q=1"], Config())
    assert results == [("/", 200), ("/raise", 500), ("/noresponse", 500), ("/scope?q=1", 200)]
    assert threading.active_count() == before
    import asyncio

    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()


# ---------------------------------------------------------------------------------------------
# Real sockets (the server: tests/support/asgi_server.py)


def test_get_and_post_echo_streamed_body(serve):
    proc = serve()
    status, headers, body = exchange(proc, b"GET /hello?x=1 HTTP/1.1\r\nHost: a\r\n\r\n")
    assert (status, body) == (200, b"GET /hello")
    payload = os.urandom(3 * 1024 * 1024)
    with proc.connect() as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n" % len(payload))
        for i in range(0, len(payload), 256 * 1024):
            sock.sendall(payload[i : i + 256 * 1024])
        status, headers, body = read_response(sock)
    assert status == 200 and body == payload
    assert int(headers["x-messages"]) > 1  # streamed to the app in pieces


def test_keep_alive_and_pipelining_in_order(serve):
    proc = serve()
    with proc.connect() as sock:
        buf = bytearray()
        sock.sendall(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock, buf)[2] == b"GET /one"
        sock.sendall(
            b"GET /slow?0.2 HTTP/1.1\r\nHost: a\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /three HTTP/1.1\r\nHost: a\r\n\r\n"
        )
        assert read_response(sock, buf)[2] == b"slow done"
        assert read_response(sock, buf)[2] == b"hello"
        assert read_response(sock, buf)[2] == b"GET /three"


def test_chunked_request_and_response(serve):
    proc = serve()
    raw = (
        b"POST /chunked HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    status, headers, body = exchange(proc, raw)
    assert status == 200
    assert headers["transfer-encoding"] == "chunked"
    assert body == b"hello world|end"


def test_expect_100_continue(serve):
    proc = serve()
    with proc.connect() as sock:
        buf = bytearray()
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        status, _, _ = read_response(sock, buf)
        assert status == 100
        sock.sendall(b"data")
        status, _, body = read_response(sock, buf)
        assert (status, body) == (200, b"data")
        # The connection is still usable.
        sock.sendall(b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock, buf)[2] == b"GET /after"


def test_expect_100_continue_not_sent_when_app_ignores_body(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"POST /hello HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        status, headers, body = read_response(sock)
        assert (status, body) == (200, b"POST /hello")
        assert headers.get("connection") == "close"
        assert at_eof(sock)


def test_response_head_is_sent_before_the_first_body_message(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"POST /head-first HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(65536)  # would block forever if the head waited for the body
        assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head.lower()
        sock.sendall(b"ping")
        data = head.partition(b"\r\n\r\n")[2]
        while not data.endswith(b"0\r\n\r\n"):
            data += sock.recv(65536)
        assert data == b"4\r\nping\r\n0\r\n\r\n"


def test_head_http10_and_connection_close(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"HEAD /big?5000 HTTP/1.1\r\nHost: a\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"\r\n\r\n")
        assert b"content-length: 5000" in data.lower()
        sock.sendall(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        assert read_response(sock)[2] == b"GET /next"  # no stray body bytes after the HEAD
    with proc.connect() as sock:
        sock.sendall(b"GET /old HTTP/1.0\r\n\r\n")
        status, headers, body = read_response(sock)
        assert status == 200 and body == b"GET /old"
        assert at_eof(sock)
    with proc.connect() as sock:
        sock.sendall(b"GET /bye HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        status, headers, body = read_response(sock)
        assert body == b"GET /bye" and headers["connection"] == "close"
        assert at_eof(sock)


@pytest.mark.parametrize("path", ["/raise", "/noresponse", "/bad-order"])
def test_app_errors_give_500(serve, path):
    proc = serve()
    status, _, _ = exchange(proc, b"GET %s HTTP/1.1\r\nHost: a\r\n\r\n" % path.encode())
    assert status == 500
    assert exchange(proc, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[0] == 200
    code, out, err = proc.finish()
    assert "ASGI" in err


def test_app_raising_after_start_closes_connection(serve):
    proc = serve()
    with proc.connect() as sock:
        sock.sendall(b"GET /raise-after-start HTTP/1.1\r\nHost: a\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"partial")


@pytest.mark.parametrize("half_close", [False, True])
def test_disconnect_mid_body_reaches_the_app(serve, tmp_path, half_close):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    sock = proc.connect()
    sock.sendall(b"POST /wait-disconnect HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\npartial")
    wait_for_line(logfile, "waiting for the disconnect")  # the request is in the app
    if half_close:
        sock.shutdown(socket.SHUT_WR)
    else:
        sock.close()
    wait_for_line(logfile, "disconnected")
    assert logfile.read_text() == "startup\nwaiting for the disconnect\ndisconnected\n"
    sock.close()
    code, out, err = proc.finish()
    assert code == 0 and "Traceback" not in err, err


def test_client_disconnect_during_slow_request(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    sock = proc.connect()
    sock.sendall(b"GET /slow?0.3 HTTP/1.1\r\nHost: a\r\n\r\n")
    wait_for_line(logfile, "slow")  # the request is in the app
    sock.close()
    wait_for_line(logfile, "slow over")  # the app is done with a client that was gone
    assert exchange(proc, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[0] == 200
    code, out, err = proc.finish()
    assert "Exception" not in err, err
