"""run_wsgi with the app called directly and the sends collected (PEP 3333): start_response and
exc_info, the body's framing, early hints, the headers an app may send, wsgi.file_wrapper and
sendfile, and the warm-up calls."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
from support.wsgi_environ import env, req

from refork.config import Config
from refork.http.events import Request
from refork.warmup import warm
from refork.wsgi import run_wsgi

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
