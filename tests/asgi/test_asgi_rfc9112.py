"""ASGI over HTTP/1.1, exact bytes over a socket (RFC 9112): malformed requests (400) answered after
the valid ones before them, an app's Connection: close and bad header values, unknown methods,
HTTP/1.2, endless trailers (431), bad chunked bodies, trailers and absolute-form targets.
"""

from __future__ import annotations

import json
import time

import pytest
from support.asgi_server import at_eof, read_response
from support.waits import wait_for_line


def test_malformed_request_gets_400_and_app_not_called(serve, tmp_path):
    logfile = tmp_path / "events.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    with proc.connect() as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: a\r\nbad header\r\n\r\n")
        status, _, _ = read_response(sock)
        assert status == 400
        assert at_eof(sock)
    # A valid request pipelined before a bad one is answered first.
    with proc.connect() as sock:
        buf = bytearray()
        sock.sendall(b"GET /slow?0.1 HTTP/1.1\r\nHost: a\r\n\r\n")
        wait_for_line(logfile, "slow")  # the bad request arrives while the good one is in the app
        sock.sendall(b"GARBAGE\r\n\r\n")
        assert read_response(sock, buf)[0] == 200
        assert read_response(sock, buf)[0] == 400
    code, out, err = proc.finish()
    assert "SERVED 1" in out  # only the /slow request reached the app


RFC_APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    if scope["path"] == "/close":
        headers = [(b"connection", b"close"), (b"content-length", b"3")]
    elif scope["path"] == "/ctl":
        headers = [(b"x-bad", b"a\\x0bb"), (b"content-length", b"3")]
    else:
        headers = [(b"content-length", b"3")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"bye"})
"""


@pytest.fixture
def rfc_app(serve, tmp_path):
    (tmp_path / "rfc_app.py").write_text(RFC_APP)
    return serve("rfc_app:app", env={"PYTHONPATH": str(tmp_path)})


def test_app_connection_close_is_honoured_over_a_socket(rfc_app):
    sock = rfc_app.connect()
    sock.sendall(b"GET /close HTTP/1.1\r\nHost: a\r\n\r\nGET /other HTTP/1.1\r\nHost: a\r\n\r\n")
    status, headers, body = read_response(sock)
    assert status == 200 and body == b"bye" and headers["connection"] == "close"
    assert at_eof(sock)
    sock.close()


def test_control_character_in_an_app_header_is_a_500_over_a_socket(rfc_app):
    sock = rfc_app.connect()
    sock.sendall(b"GET /ctl HTTP/1.1\r\nHost: a\r\n\r\n")
    raw = b""
    while not raw.endswith(b"\r\n\r\nInternal Server Error"):
        data = sock.recv(65536)
        if not data:
            break
        raw += data
    sock.close()
    assert raw.startswith(b"HTTP/1.1 500 ") and b"\x0b" not in raw
    _, _, err = rfc_app.finish()
    assert "Invalid response head" in err


def test_unknown_method_and_http12_over_a_socket(rfc_app):
    sock = rfc_app.connect()
    sock.sendall(b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.2\r\nHost: a\r\n\r\n")
    buf = bytearray()  # both responses may come in one recv()
    assert read_response(sock, buf)[0] == 200
    status, headers, _ = read_response(sock, buf)
    assert status == 200 and "connection" not in headers  # answered as 1.1: kept alive
    sock.close()


def test_endless_trailer_gets_431_over_a_socket(serve):
    from support.load import send_until_refused

    proc = serve()
    sock = proc.connect()
    head = b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX-T: "
    sent, answer = send_until_refused(sock, head, b"A" * 65536, 20 << 20)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert sent < 20 << 20


def test_unknown_method_behind_a_request_split_across_sends(serve):
    proc = serve()
    sock = proc.connect()
    sock.sendall(b"GET /one HTTP/1.1\r\nHo")
    time.sleep(0.05)  # (the input, not a wait) most likely two reads; the outcome must not depend on it
    sock.sendall(b"st: a\r\n\r\nX-SYNC /two HTTP/1.1\r\nHost: a\r\n\r\n")
    buf = bytearray()
    assert read_response(sock, buf)[2] == b"GET /one"
    assert read_response(sock, buf)[2] == b"X-SYNC /two"
    sock.close()


BAD_HEAD = b"GET /bad HTTP/1.1\r\nHost x\r\n\r\n"  # a field line without its colon


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_pipeline_valid_invalid_valid_answers_the_first_then_400(serve, loop):
    """RFC 9112 9.3.2: the requests before the bad one are answered in order and fully written
    (3 MB: more than the socket buffers), then the 400, then the connection closes."""
    proc = serve(loop=loop)
    sock = proc.connect()
    sock.sendall(
        b"GET /one HTTP/1.1\r\nHost: a\r\n\r\nGET /big?3000000 HTTP/1.1\r\nHost: a\r\n\r\n"
        + BAD_HEAD
        + b"GET /three HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    buf = bytearray()
    assert read_response(sock, buf)[2] == b"GET /one"
    assert read_response(sock, buf)[2] == b"x" * 3000000
    assert read_response(sock, buf)[0] == 400
    assert not buf and at_eof(sock)
    sock.close()


def test_a_bad_body_behind_a_running_request_is_answered_after_it(serve):
    """The request whose body turned bad was queued behind a running one: it never starts; the
    running one is answered, then the 400."""
    proc = serve()
    sock = proc.connect()
    sock.sendall(
        b"GET /slow?0.2 HTTP/1.1\r\nHost: a\r\n\r\n"
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\nzz\r\n"
    )
    buf = bytearray()
    assert read_response(sock, buf)[2] == b"slow done"
    assert read_response(sock, buf)[0] == 400
    assert not buf and at_eof(sock)
    sock.close()


def test_a_bad_body_under_a_waiting_app_gets_400_and_the_app_a_disconnect(serve):
    """The app is in receive() when the chunked body turns bad: it sees http.disconnect, the
    client gets the 400 (the app had not started a response)."""
    proc = serve()
    sock = proc.connect()
    sock.sendall(
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
    )
    buf = bytearray()
    assert read_response(sock, buf)[0] == 100  # sent when the app calls receive(): it waits there
    sock.sendall(b"2\r\nhi\r\nzz\r\n")
    assert read_response(sock, buf)[0] == 400
    assert not buf and at_eof(sock)
    sock.close()
    code, _, err = proc.finish()
    assert code == 0 and "Exception in ASGI application" not in err, err


def test_trailers_and_absolute_form_host_in_the_scope(serve):
    proc = serve()
    sock = proc.connect()
    sock.sendall(
        b"POST /scope HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\nz\r\n0\r\nX-Trailer: t\r\n\r\n"
        b"GET http://target.example:81/scope HTTP/1.1\r\nHost: ignored\r\n\r\n"
    )
    buf = bytearray()  # both responses may arrive in one recv()
    first = json.loads(read_response(sock, buf)[2])
    second = json.loads(read_response(sock, buf)[2])
    sock.close()
    assert [n for n, _ in first["headers"]] == ["host", "transfer-encoding"]
    assert ["host", "target.example:81"] in second["headers"] and second["path"] == "/scope"
