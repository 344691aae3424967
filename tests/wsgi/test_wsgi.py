"""PEP 3333: environ, wsgi.input, start_response / exc_info, run_wsgi, and a validated app over a socket."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time

import pytest
import requests
from apps import Reader, Server  # noqa: E402
from apps.wsgi_apps import FILE_DATA  # noqa: E402
from support.load import send_until_refused

from refork.config import Config
from refork.http.body import EMPTY_INPUT, BodyBuffer, InputStream, Spool
from refork.http.events import ParseError, Request
from refork.http.forwarded import TrustedProxies
from refork.warmup import warm
from refork.wsgi import EnvironBuilder, FileWrapper, run_wsgi

PROXIES = TrustedProxies(["127.0.0.1"])


def req(target: bytes = b"/", method: str = "GET", headers=None, version: str = "1.1", **kw) -> Request:
    path, _, query = target.partition(b"?")
    if headers is None:
        headers = [(b"host", b"example.com")]
    return Request(method, target, path, query, version, headers, **kw)


def env(request: Request, body: InputStream | None = None, client=("127.0.0.1", 5555), **kw):
    kw.setdefault("server", ("0.0.0.0", 8000))
    kw.setdefault("proxies", PROXIES)
    return EnvironBuilder(url_scheme="http", **kw).build(request, body or EMPTY_INPUT, client)


# ------------------------------------------------------------------------------ environ


def test_environ_basics():
    r = req(
        b"/a%20b/caf%C3%A9?x=1&y=%20",
        headers=[
            (b"host", b"example.com:8080"),
            (b"accept", b"text/html"),
            (b"accept", b"text/plain"),
            (b"content-type", b"text/plain"),
            (b"x_spoof", b"1"),
            (b"cookie", b"a=1"),
            (b"cookie", b"b=2"),
        ],
    )
    e = env(r)
    assert e["REQUEST_METHOD"] == "GET"
    assert e["SCRIPT_NAME"] == ""
    assert e["PATH_INFO"] == "/a b/caf\u00c3\u00a9"  # UTF-8 bytes as latin-1, per PEP 3333
    assert e["QUERY_STRING"] == "x=1&y=%20"
    assert e["SERVER_NAME"] == "example.com" and e["SERVER_PORT"] == "8080"
    assert e["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert e["HTTP_ACCEPT"] == "text/html,text/plain"
    assert e["HTTP_COOKIE"] == "a=1; b=2"
    assert e["CONTENT_TYPE"] == "text/plain" and "HTTP_CONTENT_TYPE" not in e
    assert not any("SPOOF" in k for k in e)  # underscores could alias X-Spoof: dropped
    assert e["REMOTE_ADDR"] == "127.0.0.1" and e["REMOTE_PORT"] == "5555"
    assert e["wsgi.version"] == (1, 0) and e["wsgi.url_scheme"] == "http"
    assert e["wsgi.input"] is EMPTY_INPUT and e["wsgi.input_terminated"] is True
    assert e["wsgi.run_once"] is False and e["wsgi.multiprocess"] is True
    assert e["wsgi.file_wrapper"] is FileWrapper
    assert "CONTENT_LENGTH" not in e


def test_environ_script_name_from_root_path():
    e = env(req(b"/app/x/y"), root_path="/app/")
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "/x/y")
    e = env(req(b"/app"), root_path="/app")
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "")
    e = env(req(b"/application"), root_path="/app")
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "/application")
    e = env(req(b"/%61pp/z"), root_path="/app")  # compared after decoding
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "/z")


def test_environ_server_name_without_host_and_ipv6_host():
    e = env(req(b"/", version="1.0", headers=[]), server=("10.1.2.3", 9000))
    assert (e["SERVER_NAME"], e["SERVER_PORT"], e["SERVER_PROTOCOL"]) == ("10.1.2.3", "9000", "HTTP/1.0")
    e = env(req(headers=[(b"host", b"[::1]:8443")]))
    assert (e["SERVER_NAME"], e["SERVER_PORT"]) == ("::1", "8443")
    e = env(req(headers=[(b"host", b"example.com")]))
    assert e["SERVER_PORT"] == "80"
    e = env(req(headers=[]), server="/run/app.sock", client=None)
    assert e["SERVER_NAME"] == "localhost" and e["REMOTE_ADDR"] == "" and "REMOTE_PORT" not in e


def test_environ_forwarded_trusted_and_untrusted():
    headers = [
        (b"host", b"example.com"),
        (b"x-forwarded-proto", b"https"),
        (b"x-forwarded-for", b"203.0.113.7, 10.0.0.2"),
    ]
    proxies = TrustedProxies(["127.0.0.1", "10.0.0.0/8"])
    trusted = env(req(headers=headers), client=("127.0.0.1", 1), proxies=proxies)
    assert trusted["wsgi.url_scheme"] == "https"
    assert trusted["SERVER_PORT"] == "443"
    assert trusted["REMOTE_ADDR"] == "203.0.113.7"
    untrusted = env(req(headers=headers), client=("192.0.2.1", 1), proxies=TrustedProxies(["127.0.0.1"]))
    assert untrusted["wsgi.url_scheme"] == "http"
    assert untrusted["SERVER_PORT"] == "80"
    assert untrusted["REMOTE_ADDR"] == "192.0.2.1"
    # a unix-socket peer follows --forwarded-allow-ips like any peer: trusted only with `unix:`
    unix = env(req(headers=headers), client=None, server="/tmp/s", proxies=TrustedProxies(["127.0.0.1"]))
    assert unix["wsgi.url_scheme"] == "http" and unix["REMOTE_ADDR"] == ""
    unix = env(req(headers=headers), client=None, server="/tmp/s", proxies=TrustedProxies(["unix:"]))
    assert unix["wsgi.url_scheme"] == "https" and unix["REMOTE_ADDR"] == "10.0.0.2"


def test_environ_content_length_of_chunked_body():
    buf = BodyBuffer(1 << 20)
    buf.write(b"hello ")
    buf.write(b"world")
    e = env(req(b"/", "POST", chunked=True), buf.finish())
    assert e["CONTENT_LENGTH"] == "11"
    assert e["wsgi.input"].read() == b"hello world"


# ------------------------------------------------------------------------------ wsgi.input


@pytest.mark.parametrize("threshold", [1 << 20, 8])
def test_input_stream(threshold):
    data = b"first line\nsecond\n\nlast without newline"
    buf = BodyBuffer(threshold)
    for i in range(0, len(data), 5):
        buf.write(data[i : i + 5])
    stream = buf.finish()
    assert stream.length == len(data)
    assert stream.read(5) == b"first"
    assert stream.readline() == b" line\n"
    assert stream.readline(3) == b"sec"
    assert stream.readline(-1) == b"ond\n"
    assert stream.readlines() == [b"\n", b"last without newline"]
    assert stream.read() == b"" and stream.read(10) == b"" and stream.readline() == b""
    stream.close()

    buf = BodyBuffer(threshold)
    buf.write(data)
    stream = buf.finish()
    assert list(stream) == data.splitlines(keepends=True)
    stream.close()
    buf = BodyBuffer(threshold)
    buf.write(data)
    stream = buf.finish()
    assert stream.readlines(12) == [b"first line\n", b"second\n"]
    assert stream.read(None) == b"\nlast without newline"
    stream.close()


def test_input_spools_to_a_file_past_the_threshold():
    buf = BodyBuffer(10)
    buf.write(b"x" * 8)
    assert buf._file is None
    buf.write(b"y" * 8)
    assert buf._file is not None
    stream = buf.finish()
    assert stream.read() == b"x" * 8 + b"y" * 8
    stream.close()
    assert EMPTY_INPUT.read() == b"" and list(EMPTY_INPUT) == [] and EMPTY_INPUT.readlines() == []


def test_a_spooled_body_holds_what_arrived_not_what_it_declares():
    spool = Spool(100)
    declared = BodyBuffer(10, spool, length=90)
    declared.write(b"x" * 20)  # spilled: 20 arrived of the 90 declared, and only 20 held
    assert spool.used == 20
    with pytest.raises(ParseError) as refused:  # 20 arrived + 81 declared > 100: not now
        BodyBuffer(10, spool, length=81).write(b"y" * 11)
    assert refused.value.status == 503
    with pytest.raises(ParseError) as never:  # more than the whole spool: never
        BodyBuffer(10, spool, length=101).write(b"w" * 11)
    assert never.value.status == 413
    small = BodyBuffer(10, spool, length=60)  # 20 + 60 fit
    small.write(b"z" * 11)
    assert spool.used == 31
    declared.write(b"x" * 60)
    small.write(b"z" * 9)
    assert spool.used == 100
    with pytest.raises(ParseError) as full:  # what arrives past the cap: 503
        small.write(b"z")
    assert full.value.status == 503
    declared.finish().close()
    small.discard()
    assert spool.used == 0


def test_a_full_spool_disk_is_a_507(monkeypatch):
    import errno
    import tempfile

    class Full:
        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            pass

    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: Full())
    spool = Spool(1000)
    buf = BodyBuffer(10, spool)
    with pytest.raises(ParseError) as full:
        buf.write(b"x" * 11)
    assert full.value.status == 507
    buf.discard()
    assert spool.used == 0


# ------------------------------------------------------------------------------ run_wsgi


class Sink:
    def __init__(self, fail: bool = False) -> None:
        self.sends: list[bytes] = []
        self.fail = fail

    def __call__(self, data: bytes) -> None:
        if self.fail:
            raise BrokenPipeError("gone")
        self.sends.append(data)

    @property
    def data(self) -> bytes:
        return b"".join(self.sends)


def run(app, request: Request | None = None, sink: Sink | None = None, sendfile=None):
    """(status, body bytes, sink, keep-alive)"""
    request = request or req()
    sink = sink if sink is not None else Sink()
    environ = env(request)
    status, length, keep = run_wsgi(app, environ, request, sink, sendfile)
    return status, length, sink, keep


def test_one_element_list_is_one_send_with_content_length():
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hello"]

    status, length, sink, keep = run(app)
    assert (status, length) == (200, 5)
    assert len(sink.sends) == 1
    head, _, body = sink.data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"\r\nContent-Length: 5" in head and body == b"hello"
    assert keep


@pytest.mark.parametrize(
    ("headers", "sent"),
    [
        ([], b""),  # a bare 103, as gunicorn sends it
        ([(b"Link", b"</a.css>; rel=preload")], b"Link: </a.css>; rel=preload\r\n"),  # bytes too
        ([("X-A", " 1\t"), ("Link", "</b>")], b"X-A: 1\r\nLink: </b>\r\n"),  # trimmed, in order
    ],
)
def test_early_hints_frame_gunicorns_header_pairs(headers, sent):
    def app(environ, start_response):
        environ["wsgi.early_hints"](headers)
        start_response("200 OK", [])
        return [b"ok"]

    sink = run(app)[2]
    assert sink.sends[0] == b"HTTP/1.1 103 Early Hints\r\n" + sent + b"\r\n"
    assert sink.sends[1].startswith(b"HTTP/1.1 200 OK\r\n")


@pytest.mark.parametrize(
    ("headers", "error"),
    [
        ([("Bad Name", "x")], ValueError),  # not a token
        ([("Link", "</a>\r\nX: y")], ValueError),  # would split the response
        ([("Link", "</a>\x7f")], ValueError),
        ([("Link", 1)], TypeError),
    ],
)
def test_early_hints_refuse_what_would_split_the_response(headers, error, caplog):
    def app(environ, start_response):
        environ["wsgi.early_hints"](headers)
        start_response("200 OK", [])
        return [b"ok"]

    status, _, sink, _ = run(app)
    assert status == 500 and b" 103 " not in sink.data
    assert error.__name__ in caplog.text


def test_early_hints_are_ignored_after_the_head_and_for_http10():
    def app(environ, start_response):
        hints = environ["wsgi.early_hints"]
        hints([("Bad Name", "x")])  # HTTP/1.0: neither checked nor sent (gunicorn's order)
        start_response("200 OK", [])
        yield b"a"
        hints([("Link", "</late>")])
        yield b"b"

    assert b" 103 " not in run(app, req(version="1.0"))[2].data
    status, _, sink, _ = run(app, req(version="1.1"))  # (the bad name, checked: a 500)
    assert status == 500

    def late(environ, start_response):
        start_response("200 OK", [])
        yield b"a"
        environ["wsgi.early_hints"]([("Link", "</late>")])
        yield b"b"

    status, _, sink, _ = run(late)
    assert status == 200 and b" 103 " not in sink.data


def test_generator_body_is_chunked_and_write_works():
    def app(environ, start_response):
        write = start_response("201 Created", [("Content-Type", "text/plain")])
        write(b"w1")

        def gen():
            yield b"a"
            yield b""
            yield b"b"

        return gen()

    status, length, sink, keep = run(app)
    assert status == 201
    assert b"transfer-encoding: chunked" in sink.data.lower()
    assert sink.data.endswith(b"2\r\nw1\r\n1\r\na\r\n1\r\nb\r\n0\r\n\r\n")
    assert keep


def test_head_request_sends_no_body():
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hello"]

    status, _, sink, _ = run(app, req(method="HEAD"))
    assert status == 200 and sink.data.endswith(b"\r\n\r\n") and b"hello" not in sink.data


def test_exc_info_before_head_replaces_status():
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        try:
            raise ValueError("boom")
        except ValueError:
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"sorry"]

    status, _, sink, _ = run(app)
    assert status == 503 and sink.data.startswith(b"HTTP/1.1 503 Service Unavailable")
    assert sink.data.endswith(b"sorry")


def test_exc_info_after_head_reraises_and_closes(caplog):
    seen = []

    def app(environ, start_response):
        write = start_response("200 OK", [("Content-Type", "text/plain")])
        write(b"partial")
        try:
            raise ValueError("late failure")
        except ValueError:
            try:
                start_response("500 Oops", [], sys.exc_info())
            except ValueError as e:
                seen.append(e)
                raise

    status, _, sink, keep = run(app)
    assert status == 200 and seen and str(seen[0]) == "late failure"
    assert not keep
    assert b"500" not in sink.data


def test_second_start_response_without_exc_info_is_an_error():
    def app(environ, start_response):
        start_response("200 OK", [])
        start_response("200 OK", [])
        return [b""]

    status, _, sink, keep = run(app)
    assert status == 500 and sink.data.startswith(b"HTTP/1.1 500") and not keep


@pytest.mark.parametrize(
    "status,headers",
    [
        ("200 OK", [("Keep-Alive", "timeout=5")]),
        ("200 OK", [("Transfer-Encoding", "chunked")]),
        ("200 OK", [("X-Bad", "a\r\nInjected: 1")]),
        ("200 OK", [("X-Bad", "a\x0bb")]),  # every CTL but HTAB is refused, not only CR/LF/NUL
        ("200 OK", [("X-Bad", "a\x7fb")]),
        ("200 OK", [("X-Bad", "\x01")]),
        ("200 OK", [("X-Bad", "a\x1bb")]),
        ("200 \x01K", []),
        ("200 OK", [("Bad Name", "x")]),
        ("200 OK", [(b"X-Bytes", "x")]),
        ("200 OK", [("X-Not-Latin1", "\u20ac")]),
        ("200 OK", (("X-Tuple", "list expected"),)),
        (b"200 OK", []),
        ("200", []),
        ("OK 200", []),
    ],
)
def test_bad_status_or_headers_become_500(status, headers, caplog):
    closed = []

    class Body(list):
        def close(self):
            closed.append(True)

    def app2(environ, start_response):
        try:
            start_response(status, headers)
        except (TypeError, ValueError, AssertionError):
            closed.append("raised in start_response")
            raise
        return Body([b"x"])

    code, _, sink, _ = run(app2)
    assert code == 500 and sink.data.startswith(b"HTTP/1.1 500")
    assert closed == ["raised in start_response"]


def test_app_error_is_500_and_close_is_called(caplog):
    closed = []

    class Body:
        def __iter__(self):
            raise RuntimeError("iteration failed")

        def close(self):
            closed.append(True)

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()

    with caplog.at_level("ERROR", logger="refork"):
        status, _, sink, keep = run(app)
    assert status == 500 and closed == [True] and not keep
    assert "iteration failed" in caplog.text
    assert sink.data.startswith(b"HTTP/1.1 500")


def test_client_disconnect_still_closes_the_iterable(caplog):
    closed = []

    class Body:
        def __iter__(self):
            yield b"a"
            yield b"b"

        def close(self):
            closed.append(True)

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return Body()

    with caplog.at_level("ERROR", logger="refork"):
        status, _, _, keep = run(app, sink=Sink(fail=True))
    assert closed == [True] and not keep
    assert "Traceback" not in caplog.text


def test_file_wrapper_uses_sendfile_with_known_length():
    calls = []
    out = []

    def sendfile(fd: int, offset: int, count: int | None) -> int:
        calls.append((offset, count))
        data = os.pread(fd, count or 1 << 30, offset)
        out.append(data)
        return len(data)

    with tempfile.TemporaryFile() as f:
        f.write(b"0123456789" * 100)
        f.seek(10)

        def app(environ, start_response):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return environ["wsgi.file_wrapper"](f)

        status, length, sink, keep = run(app, sendfile=sendfile)
        assert status == 200 and calls == [(10, 990)] and length == 990
        assert b"Content-Length: 990" in sink.data and keep
        assert b"".join(out) == (b"0123456789" * 100)[10:]


def test_file_wrapper_without_sendfile_reads_blocks():
    with tempfile.TemporaryFile() as f:
        f.write(b"abc" * 1000)
        f.seek(0)

        def app(environ, start_response):
            start_response("200 OK", [("Content-Type", "text/plain")])
            return environ["wsgi.file_wrapper"](f, 100)

        status, length, sink, _ = run(app)
        assert status == 200 and length == 3000 and sink.data.endswith(b"\r\n\r\n" + b"abc" * 1000)
        assert b"Content-Length: 3000\r\n" in sink.data


def test_warmup_wsgi():
    paths = []

    def app(environ, start_response):
        paths.append((environ["PATH_INFO"], environ["QUERY_STRING"]))
        if environ["PATH_INFO"] == "/boom":
            raise RuntimeError("warm-up failure")
        start_response("204 No Content", [])
        return []

    result = warm(app, "wsgi", ["/", "/x?y=1", "/boom"], Config())
    assert result == [("/", 204), ("/x?y=1", 204), ("/boom", 500)]
    assert paths == [("/", ""), ("/x", "y=1"), ("/boom", "")]


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


def test_header_value_with_a_tab_is_fine():
    def app(environ, start_response):
        start_response("200 OK", [("X-Tab", "a\tb"), ("X-Latin1", "\xe9")])
        return [b"x"]

    status, _, sink, _ = run(app)
    assert status == 200 and b"\r\nX-Tab: a\tb\r\n" in sink.data and b"X-Latin1: \xe9\r\n" in sink.data


@pytest.mark.parametrize("value", ["close", "Close", "keep-alive, close"])
def test_app_connection_close_is_honoured(value):
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain"), ("Connection", value)])
        return [b"bye"]

    status, _, sink, keep = run(app)
    head = sink.data.partition(b"\r\n\r\n")[0]
    assert status == 200 and not keep
    assert head.count(b"Connection:") == 1 and b"\r\nConnection: close" in head


def test_app_connection_keep_alive_is_dropped():
    def app(environ, start_response):
        start_response("200 OK", [("Connection", "keep-alive")])
        return [b"x"]

    status, _, sink, keep = run(app)
    assert status == 200 and keep and b"Connection" not in sink.data


def test_control_character_in_a_header_value_is_a_logged_500(caplog):
    def app(environ, start_response):
        start_response("200 OK", [("X-Bad", "a\x0bb")])
        return [b"x"]

    status, _, sink, keep = run(app)
    assert status == 500 and not keep and b"\x0b" not in sink.data
    assert "Error in WSGI app" in caplog.text and "control character" in caplog.text


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


@pytest.mark.parametrize("method,sends", [("GET", 2), ("HEAD", 1)])
def test_large_single_body_is_not_copied_into_the_head(method, sends):
    big = b"x" * 200_000

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [big]

    status, _, sink, keep = run(app, req(method=method))
    assert status == 200 and len(sink.sends) == sends and keep
    assert b"Content-Length: 200000\r\n" in sink.sends[0]
    if method == "GET":
        assert sink.sends[1] == big


def test_large_body_over_a_socket(raw_app):
    big = os.urandom(300_000)
    s = requests.Session()
    assert s.post(raw_app.url("/echo"), data=big).content == big
    r = s.head(raw_app.url("/echo"), data=big)
    assert r.status_code == 200 and r.headers["content-length"] == "300000" and r.content == b""


def test_wsgi_errors_goes_to_the_error_log(caplog):
    e = env(req())
    with caplog.at_level("ERROR", logger="refork"):
        e["wsgi.errors"].write("something odd\n")
        e["wsgi.errors"].writelines(["line a\n", "line b\n"])
        e["wsgi.errors"].flush()
    assert [r.getMessage() for r in caplog.records] == ["something odd", "line a", "line b"]


def test_file_wrapper_over_a_non_file_reads_blocks_even_with_sendfile():
    import io

    def sendfile(fd, offset, count):
        raise AssertionError("not a regular file: sendfile must not be used")

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "text/plain")])
        return environ["wsgi.file_wrapper"](io.BytesIO(b"in memory"), 4)

    status, length, sink, keep = run(app, sendfile=sendfile)
    assert status == 200 and length == 9 and keep and b"Transfer-Encoding: chunked" in sink.data
    assert sink.data.endswith(b"0\r\n\r\n")


# ------------------------------------------------------------------------------ exact bytes (issue 8)

CHUNKED_POST = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_endless_trailer_gets_431_and_the_worker_stays_small(validated):
    pid = validated.proc.pid
    warm = validated.connect()  # the first refusal's lazy imports and buffers are part of the baseline
    _, warmed = send_until_refused(warm, CHUNKED_POST + b"0\r\nX-T: ", b"A" * 65536, 1 << 20)
    warm.close()
    assert warmed.startswith(b"HTTP/1.1 431 "), warmed[:100]
    before = _rss_kib(pid)
    sock = validated.connect()
    sent, answer = send_until_refused(sock, CHUNKED_POST + b"0\r\nX-T: ", b"A" * 65536, 20 << 20)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
    assert sent < 20 << 20  # refused long before the 20 MB were sent
    assert _rss_kib(pid) - before < 8 * 1024  # was: RSS grew with every trailer byte
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
    """The parser replays from the last read boundary (see test_http_parser): however the reads
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
