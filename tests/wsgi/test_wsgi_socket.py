"""A real server over a socket: a wsgiref-validated app and a raw one (what validate would refuse),
sendfile, Connection: close from the app, RFC 9112 request lines, bounded chunked framing and
trailers, and the body spool's cap."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
import requests
from apps import Reader, Server  # noqa: E402
from apps.wsgi_apps import FILE_DATA  # noqa: E402
from support.load import send_until_refused
from support.process_memory import rss_kib

# ------------------------------------------------------------------------------ over a socket


@pytest.fixture(scope="module")
def validated():
    server = Server("apps.wsgi_apps:app")
    yield server
    server.stop()


def test_validated_app_get_post_and_body_reading(validated):
    s = requests.Session()
    r = s.get(validated.url("/"))
    assert (r.status_code, r.text) == (200, "root")
    r = s.post(validated.url("/echo"), data=b"x" * 100_000)
    assert r.status_code == 200 and r.content == b"x" * 100_000
    body = b"one\ntwo\nthree"
    assert s.post(validated.url("/readline"), data=body).json() == ["one\n", "two\n", "three"]
    assert s.post(validated.url("/readlines"), data=body).json() == ["one\n", "two\n", "three"]
    assert s.post(validated.url("/iter"), data=body).json() == ["one\n", "two\n", "three"]
    assert s.get(validated.url("/write")).text == "written then returned"
    assert s.get(validated.url("/gen")).text == "part0;part1;part2;part3;part4;"
    r = s.get(validated.url("/file"))
    assert r.status_code == 200 and r.content == FILE_DATA
    e = s.get(validated.url("/environ?q=1"), headers={"X-Test": "yes"}).json()
    assert e["PATH_INFO"] == "/environ" and e["QUERY_STRING"] == "q=1" and e["HTTP_X_TEST"] == "yes"
    assert e["REMOTE_ADDR"] == "127.0.0.1" and e["SERVER_PORT"] == str(validated.port)
    assert e["wsgi.multithread"] is False
    # a big body is spooled to a file (threshold 1 MiB) and still read back whole
    big = os.urandom(1_500_000)
    assert s.post(validated.url("/echo"), data=big).content == big


def test_validated_app_chunked_upload(validated):
    def gen():
        yield b"line one\n"
        yield b"line two\n"

    r = requests.post(validated.url("/readline"), data=gen())
    assert r.json() == ["line one\n", "line two\n"]


def test_close_always_called(validated):
    s = requests.Session()
    before = s.get(validated.url("/stats")).json()["closed"]
    assert s.get(validated.url("/closing")).text == "abc"
    with pytest.raises(requests.exceptions.RequestException):
        s.get(validated.url("/closing-fail"))  # head sent, then the app fails: connection cut
    # the client goes away in the middle of a large body
    sock = validated.connect()
    sock.sendall(b"GET /closing-big HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.recv(1000)
    sock.close()
    for _ in range(100):
        if requests.get(validated.url("/stats")).json()["closed"] == before + 3:
            break
        import time

        time.sleep(0.05)
    assert requests.get(validated.url("/stats")).json()["closed"] == before + 3


def test_app_exception_is_500_and_server_keeps_going(validated):
    r = requests.get(validated.url("/error"))
    assert r.status_code == 500
    assert requests.get(validated.url("/")).status_code == 200
    assert "app error on purpose" in validated.stderr()


@pytest.fixture(scope="module")
def raw_app():
    server = Server("apps.wsgi_apps:raw")
    yield server
    server.stop()


def test_sendfile_over_a_socket(raw_app):
    sock = raw_app.connect()
    reader = Reader(sock)
    sock.sendall(b"GET /file HTTP/1.1\r\nHost: x\r\n\r\nGET /file-offset HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = reader.response()
    assert status == 200 and body == FILE_DATA and headers["content-length"] == str(len(FILE_DATA))
    status, headers, body = reader.response()
    assert status == 200 and body == FILE_DATA[100:]
    sock.sendall(b"HEAD /file HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = reader.response(head=True)
    assert status == 200 and headers["content-length"] == str(len(FILE_DATA))
    sock.sendall(b"GET /file HTTP/1.0\r\n\r\n")  # close-delimited: still sendfile
    status, headers, body = reader.response()
    assert status == 200 and body == FILE_DATA
    sock.close()


def test_app_connection_close_over_a_socket(raw_app):
    """The next pipelined request is not served: the app asked to close."""
    sock = raw_app.connect()
    sock.sendall(b"GET /hop HTTP/1.1\r\nHost: x\r\n\r\nGET /hop HTTP/1.1\r\nHost: x\r\n\r\n")
    reader = Reader(sock)
    status, headers, body = reader.response()
    # /hop sends "Connection: close": answered, then closed (issue 8: was a 500)
    assert status == 200 and body == b"never" and headers["connection"] == "close"
    assert reader.closed()
    sock.close()


def test_environ_over_unix_like_defaults(raw_app):
    e = json.loads(requests.get(raw_app.url("/environ")).content)
    assert e["SERVER_PROTOCOL"] == "HTTP/1.1" and e["wsgi.url_scheme"] == "http"


def test_large_body_over_a_socket(raw_app):
    big = os.urandom(300_000)
    s = requests.Session()
    assert s.post(raw_app.url("/echo"), data=big).content == big
    r = s.head(raw_app.url("/echo"), data=big)
    assert r.status_code == 200 and r.headers["content-length"] == "300000" and r.content == b""


# ------------------------------------------------------------------------------ exact bytes (issue 8)

CHUNKED_POST = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_endless_trailer_gets_431_and_the_worker_stays_small(validated):
    pid = validated.proc.pid
    warm = validated.connect()  # the first refusal's lazy imports and buffers are part of the baseline
    _, warmed = send_until_refused(warm, CHUNKED_POST + b"0\r\nX-T: ", b"A" * 65536, 1 << 20)
    warm.close()
    assert warmed.startswith(b"HTTP/1.1 431 "), warmed[:100]
    before = rss_kib(pid)
    sock = validated.connect()
    sent, answer = send_until_refused(sock, CHUNKED_POST + b"0\r\nX-T: ", b"A" * 65536, 20 << 20)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert sent < 20 << 20  # refused long before the 20 MB were sent
    assert rss_kib(pid) - before < 8 * 1024  # was: RSS grew with every trailer byte
    assert requests.get(validated.url("/")).text == "root"  # the worker is fine


def test_endless_chunk_extension_gets_400(validated):
    sock = validated.connect()
    _, answer = send_until_refused(sock, CHUNKED_POST + b"5;e=", b"A" * 4096, 20 << 20)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:100]


@pytest.mark.parametrize("field", [b"Host: evil", b"Content-Length: 5", b"Transfer-Encoding: chunked",
                                   b"Authorization: Basic eA==", b"Content-Type: text/evil"])  # fmt: skip
def test_forbidden_trailer_field_gets_400(validated, field):
    sock = validated.connect()
    sock.sendall(CHUNKED_POST + b"2\r\nhi\r\n0\r\n" + field + b"\r\n\r\n")
    status, _, _ = Reader(sock).response()
    sock.close()
    assert status == 400


def test_trailers_never_reach_the_environ(validated):
    sock = validated.connect()
    sock.sendall(
        b"POST /environ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nhi\r\n0\r\nX-Test: trailer\r\n\r\n"
        b"GET /environ HTTP/1.1\r\nHost: x\r\nX-Test: header\r\n\r\n"
    )
    reader = Reader(sock)
    first = json.loads(reader.response()[2])
    second = json.loads(reader.response()[2])
    sock.close()
    assert first["HTTP_X_TEST"] is None and second["HTTP_X_TEST"] == "header"


def test_unknown_method_behind_a_request_split_across_sends(raw_app):
    """The parser replays from the last read boundary (see test_http_parser_methods): however the reads
    fall, all three are served, the HTTP/1.2 one as 1.1."""
    sock = raw_app.connect()
    reader = Reader(sock)
    sock.sendall(b"GET /environ?n=a HTTP/1.1\r\nHo")
    time.sleep(0.05)  # most likely two reads; the outcome must not depend on it
    sock.sendall(
        b"st: x\r\n\r\nX-SYNC /environ?n=b HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /environ?n=c HTTP/1.2\r\nHost: x\r\n\r\n"
    )
    got = [json.loads(reader.response()[2]) for _ in range(3)]
    sock.close()
    assert [(e["REQUEST_METHOD"], e["QUERY_STRING"]) for e in got] == [
        ("GET", "n=a"),
        ("X-SYNC", "n=b"),
        ("GET", "n=c"),
    ]
    assert got[2]["SERVER_PROTOCOL"] == "HTTP/1.1"


def test_rfc9112_requests_served_over_a_socket(raw_app):
    """raw_app: wsgiref.validate would refuse the unknown method the server now accepts."""
    sock = raw_app.connect()
    reader = Reader(sock)
    sock.sendall(b"X-SYNC /environ HTTP/1.1\r\nHost: x\r\n\r\n")
    assert json.loads(reader.response()[2])["REQUEST_METHOD"] == "X-SYNC"
    sock.sendall(b"PURGE /environ HTTP/1.1\r\nHost: x\r\n\r\n")
    assert json.loads(reader.response()[2])["REQUEST_METHOD"] == "PURGE"
    sock.sendall(b"GET /environ HTTP/1.2\r\nHost: x\r\n\r\n")
    status, headers, body = reader.response()
    assert json.loads(body)["SERVER_PROTOCOL"] == "HTTP/1.1" and "connection" not in headers
    sock.sendall(b"GET http://target.example:8080/environ?q#frag HTTP/1.1\r\nHost: ignored\r\n\r\n")
    e = json.loads(reader.response()[2])
    assert (e["SERVER_NAME"], e["SERVER_PORT"], e["PATH_INFO"], e["QUERY_STRING"]) == (
        "target.example", "8080", "/environ", "q"
    )  # fmt: skip
    sock.sendall(
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: , chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    )
    assert reader.response()[2] == b"abc"
    sock.sendall(
        b'POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;n="a b"\r\nabc\r\n0\r\n\r\n'
    )
    assert reader.response()[2] == b"abc"
    sock.close()


@pytest.mark.parametrize(
    "raw,status",
    [
        (b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"GET / HTTP/3.1\r\nHost: x\r\n\r\n", 505),
    ],
)
def test_rfc9112_requests_refused_over_a_socket(validated, raw, status):
    sock = validated.connect()
    sock.sendall(raw)
    reader = Reader(sock)
    assert reader.response()[0] == status and reader.closed()
    sock.close()


SPOOL_ARGS = ("--body-spool-threshold", "64K", "--max-spool", "1500K", "--threads", "1")


def test_spool_cap_503_while_full_413_when_it_can_never_fit(start_server):
    server = start_server(*SPOOL_ARGS, app="apps.wsgi_apps:app", workers=1)
    mib = 1 << 20
    first = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    first.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % mib + b"a" * (600 << 10))
    # the first upload is spooled and holds 1 MiB of the 1500K budget: a second one does not fit now
    second = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sent, answer = send_until_refused(
        second, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % mib, b"b" * 65536, mib
    )
    second.close()
    assert answer.startswith(b"HTTP/1.1 503 ") and b"\r\nRetry-After: 1\r\n" in answer, answer[:200]
    # finishing the first gives its bytes back
    first.sendall(b"a" * (mib - (600 << 10)))
    status, _, body = Reader(first).response()
    assert status == 200 and body == b"a" * mib
    first.close()
    third = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    third.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % mib + b"c" * mib)
    assert Reader(third).response()[2] == b"c" * mib
    third.close()
    # one body bigger than the whole spool: 413
    big = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    _, answer = send_until_refused(
        big,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (2 * mib),
        b"d" * 65536,
        2 * mib,
    )
    big.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_unlimited_body_is_still_bounded_by_the_spool(start_server):
    server = start_server(*SPOOL_ARGS, "--limit-request-body", "0", app="apps.wsgi_apps:app", workers=1)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    chunk = b"10000\r\n" + b"z" * 0x10000 + b"\r\n"
    _, answer = send_until_refused(sock, CHUNKED_POST, chunk, 4 << 20)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
