"""Response framing: Content-Length vs chunked vs close-delimited, bodiless responses, keep-alive."""

from __future__ import annotations

import re
import time
from email.utils import parsedate_to_datetime

import pytest

from refork.http.events import Request
from refork.http.response import (
    CONTINUE,
    ResponseFramer,
    has_control_char,
    reason_phrase,
    simple_response,
)


def request(method: str = "GET", version: str = "1.1", keep_alive: bool | None = None) -> Request:
    if keep_alive is None:
        keep_alive = version == "1.1"
    return Request(method, b"/", b"/", b"", version, [(b"host", b"a")], keep_alive)


def split_head(head: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    assert head.endswith(b"\r\n\r\n")
    status, *lines = head[:-4].split(b"\r\n")
    fields: dict[bytes, bytes] = {}
    for line in lines:
        name, _, value = line.partition(b": ")
        assert name.lower() not in fields, f"duplicate {name!r}"
        fields[name.lower()] = value
    return status, fields


def run(framer: ResponseFramer, status: int, headers: list, chunks: list[bytes]) -> bytes:
    return framer.head(status, headers) + b"".join(framer.body(c) for c in chunks) + framer.end()


def test_content_length_response_is_sent_as_is() -> None:
    framer = ResponseFramer(request())
    head = framer.head(200, [(b"Content-Type", b"text/plain"), (b"Content-Length", b"5")])
    status, fields = split_head(head)
    assert status == b"HTTP/1.1 200 OK"
    assert fields[b"content-type"] == b"text/plain"
    assert fields[b"content-length"] == b"5"
    assert fields[b"server"] == b"refork"
    assert b"date" in fields and b"connection" not in fields and b"transfer-encoding" not in fields
    assert framer.body(b"hel") + framer.body(b"lo") == b"hello"
    assert framer.end() == b""
    assert framer.keep_alive and not framer.chunked
    assert framer.content_length == 5 and framer.body_bytes == 5


def test_app_header_names_keep_their_case_and_order() -> None:
    head = ResponseFramer(request()).head(200, [(b"X-B", b"1"), (b"x-a", b"2"), (b"Content-Length", b"0")])
    assert head.index(b"X-B: 1\r\n") < head.index(b"x-a: 2\r\n") < head.index(b"Content-Length: 0\r\n")


def test_chunked_when_no_length_on_http11() -> None:
    framer = ResponseFramer(request())
    out = run(framer, 200, [(b"Content-Type", b"text/plain")], [b"hello", b"", b" world!"])
    head, body = out.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding: chunked" in head
    assert body == b"5\r\nhello\r\n7\r\n world!\r\n0\r\n\r\n"  # the empty piece is not a last-chunk
    assert framer.chunked and framer.keep_alive and framer.body_bytes == 12


def test_http10_without_length_is_close_delimited() -> None:
    framer = ResponseFramer(request(version="1.0", keep_alive=True))
    out = run(framer, 200, [], [b"abc"])
    status, fields = split_head(out[: out.index(b"\r\n\r\n") + 4])
    assert status == b"HTTP/1.1 200 OK"
    assert fields[b"connection"] == b"close"
    assert b"transfer-encoding" not in fields
    assert out.endswith(b"\r\n\r\nabc")
    assert not framer.keep_alive and not framer.chunked


def test_http10_keep_alive_with_length() -> None:
    framer = ResponseFramer(request(version="1.0", keep_alive=True))
    _, fields = split_head(framer.head(200, [(b"Content-Length", b"0")]))
    assert fields[b"connection"] == b"keep-alive"
    framer.end()
    assert framer.keep_alive


def test_http10_without_keep_alive_closes() -> None:
    framer = ResponseFramer(request(version="1.0"))
    _, fields = split_head(framer.head(200, [(b"Content-Length", b"0")]))
    assert fields[b"connection"] == b"close"
    assert framer.end() == b"" and not framer.keep_alive


def test_head_request_has_no_body_but_keeps_length() -> None:
    framer = ResponseFramer(request("HEAD"))
    head = framer.head(200, [(b"Content-Length", b"1234")])
    _, fields = split_head(head)
    assert fields[b"content-length"] == b"1234"
    assert framer.no_body
    assert framer.body(b"ignored") == b""
    assert framer.end() == b""
    assert framer.keep_alive


def test_head_request_without_length_is_not_chunked() -> None:
    framer = ResponseFramer(request("HEAD"))
    _, fields = split_head(framer.head(200, []))
    assert b"transfer-encoding" not in fields and b"content-length" not in fields
    assert not framer.chunked
    assert framer.end() == b"" and framer.keep_alive


@pytest.mark.parametrize("status", [204, 304])
def test_bodiless_statuses(status: int) -> None:
    framer = ResponseFramer(request())
    _, fields = split_head(framer.head(status, [(b"Content-Length", b"10"), (b"ETag", b'"x"')]))
    assert framer.no_body and not framer.chunked
    assert b"transfer-encoding" not in fields
    assert (b"content-length" in fields) is (status == 304)  # forbidden in 204, meaningful in 304
    assert framer.body(b"nope") == b""
    assert framer.end() == b""
    assert framer.keep_alive


def test_body_longer_than_content_length_raises() -> None:
    framer = ResponseFramer(request())
    framer.head(200, [(b"Content-Length", b"3")])
    framer.body(b"ab")
    with pytest.raises(ValueError, match="longer than Content-Length"):
        framer.body(b"cd")
    assert not framer.keep_alive


def test_body_shorter_than_content_length_closes() -> None:
    framer = ResponseFramer(request())
    framer.head(200, [(b"Content-Length", b"10")])
    framer.body(b"abc")
    assert framer.end() == b""
    assert not framer.keep_alive


def test_request_close_and_server_stop_close_the_connection() -> None:
    for framer in (
        ResponseFramer(request(keep_alive=False)),
        ResponseFramer(request(), server_keep_alive=False),
    ):
        _, fields = split_head(framer.head(200, [(b"Content-Length", b"0")]))
        assert fields[b"connection"] == b"close"
        framer.end()
        assert not framer.keep_alive


def test_hop_by_hop_headers_from_the_app_are_replaced() -> None:
    framer = ResponseFramer(request())
    head = framer.head(
        200,
        [(b"Transfer-Encoding", b"gzip"), (b"Keep-Alive", b"timeout=5"), (b"Connection", b"keep-alive")],
    )
    _, fields = split_head(head)
    assert fields[b"transfer-encoding"] == b"chunked"
    assert b"keep-alive" not in fields and b"connection" not in fields
    assert framer.chunked and framer.keep_alive


def test_app_connection_close_is_honoured() -> None:
    framer = ResponseFramer(request())
    _, fields = split_head(framer.head(200, [(b"Connection", b"Close"), (b"Content-Length", b"0")]))
    assert fields[b"connection"] == b"close"
    framer.end()
    assert not framer.keep_alive


def test_app_date_and_server_are_kept() -> None:
    _, fields = split_head(
        ResponseFramer(request()).head(200, [(b"Date", b"yesterday"), (b"Server", b"mine")])
    )
    assert fields[b"date"] == b"yesterday" and fields[b"server"] == b"mine"


@pytest.mark.parametrize(
    "header",
    [
        (b"Bad Name", b"v"),
        (b"Bad:Name", b"v"),
        (b"", b"v"),
        (b"X-Split", b"a\r\nSet-Cookie: evil=1"),
        (b"X-LF", b"a\nb"),
        (b"X-CR", b"a\rb"),
        (b"X-NUL", b"a\x00b"),
        (b"X-VT", b"a\x0bb"),  # RFC 9110 5.5: no CTL but HTAB in a field value
        (b"X-DEL", b"a\x7fb"),
        (b"X-SOH", b"\x01"),
        (b"X-ESC", b"\x1b[31m"),
        (b"Content-Length", b"-1"),
        (b"Content-Length", b"1 2"),
        (b"Content-Length", b""),
    ],
)
def test_invalid_headers_raise(header: tuple[bytes, bytes]) -> None:
    with pytest.raises(ValueError):
        ResponseFramer(request()).head(200, [header])


def test_conflicting_content_lengths_raise_equal_ones_are_fine() -> None:
    with pytest.raises(ValueError, match="conflicting"):
        ResponseFramer(request()).head(200, [(b"Content-Length", b"1"), (b"Content-Length", b"2")])
    framer = ResponseFramer(request())
    framer.head(200, [(b"Content-Length", b"1"), (b"Content-Length", b"1")])
    assert framer.content_length == 1


def test_state_machine_misuse_raises() -> None:
    framer = ResponseFramer(request())
    with pytest.raises(ValueError):
        framer.body(b"x")
    with pytest.raises(ValueError):
        framer.end()
    framer.head(200, [(b"Content-Length", b"0")])
    with pytest.raises(ValueError):
        framer.head(200, [])
    framer.end()
    with pytest.raises(ValueError):
        framer.end()
    with pytest.raises(ValueError):
        framer.body(b"x")


def test_custom_reason_and_unknown_status() -> None:
    assert ResponseFramer(request()).head(200, [], reason=b"Fine").startswith(b"HTTP/1.1 200 Fine\r\n")
    assert ResponseFramer(request()).head(599, []).startswith(b"HTTP/1.1 599 Unknown\r\n")
    with pytest.raises(ValueError):
        ResponseFramer(request()).head(200, [], reason=b"a\r\nb")
    with pytest.raises(ValueError):
        ResponseFramer(request()).head(200, [], reason=b"a\x7fb")
    with pytest.raises(ValueError):
        ResponseFramer(request()).head(42, [])


def test_reason_phrase() -> None:
    assert reason_phrase(200) == b"OK"
    assert reason_phrase(404) == b"Not Found"
    assert reason_phrase(431) == b"Request Header Fields Too Large"
    assert reason_phrase(799) == b"Unknown"


def test_date_header_is_imf_fixdate_and_current() -> None:
    date = split_head(simple_response(400).split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n")[1][b"date"]
    assert re.fullmatch(rb"[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT", date), date
    assert abs(parsedate_to_datetime(date.decode()).timestamp() - time.time()) < 2


def test_simple_response() -> None:
    out = simple_response(400)
    head, body = out.split(b"\r\n\r\n", 1)
    status, fields = split_head(head + b"\r\n\r\n")
    assert status == b"HTTP/1.1 400 Bad Request"
    assert body == b"Bad Request\n"
    assert fields[b"content-length"] == str(len(body)).encode()
    assert fields[b"content-type"].startswith(b"text/plain")
    assert fields[b"connection"] == b"close"
    kept = simple_response(413, b"too big", keep_alive=True)
    assert kept.endswith(b"\r\n\r\ntoo big") and b"Connection:" not in kept
    assert b"Content-Length: 7\r\n" in kept


def test_continue_constant() -> None:
    assert CONTINUE == b"HTTP/1.1 100 Continue\r\n\r\n"


def test_tab_and_obs_text_in_values_are_fine() -> None:
    head = ResponseFramer(request()).head(200, [(b"X-T", b"a\tb\xe9")])
    assert b"\r\nX-T: a\tb\xe9\r\n" in head


def test_has_control_char() -> None:
    assert not has_control_char(b'text/plain; q="a b"\t\x80\xff')
    for byte in (*range(0, 9), *range(10, 32), 127):
        assert has_control_char(b"a" + bytes((byte,)))


def test_server_made_503_says_when_to_retry() -> None:
    assert b"\r\nRetry-After: 1\r\n" in simple_response(503)
    assert b"Retry-After" not in simple_response(413)


@pytest.mark.parametrize(
    ("method", "version", "headers", "data"),
    [
        ("GET", "1.1", [(b"Content-Length", b"5")], b"hello"),  # exact
        ("GET", "1.1", [(b"Content-Length", b"9")], b"hello"),  # short: the connection cannot be reused
        ("GET", "1.1", [], b"hello"),  # chunked
        ("GET", "1.1", [], b""),  # chunked, empty
        ("GET", "1.0", [], b"hello"),  # close-delimited
        ("HEAD", "1.1", [(b"Content-Length", b"5")], b"hello"),  # no body on the wire
        ("GET", "1.1", [(b"Content-Length", b"0")], b""),
    ],
)
def test_last_is_body_then_end(method: str, version: str, headers: list, data: bytes) -> None:
    """last(data), the one-call ending of a response, frames exactly what body(data) + end() does."""
    one, two = ResponseFramer(request(method, version)), ResponseFramer(request(method, version))
    one.head(200, headers)
    two.head(200, headers)
    assert one.last(data) == two.body(data) + two.end()
    assert (one.keep_alive, one.body_bytes) == (two.keep_alive, two.body_bytes)
    with pytest.raises(ValueError):
        one.last(b"")  # the response has ended


def test_last_longer_than_content_length_raises() -> None:
    framer = ResponseFramer(request())
    framer.head(200, [(b"Content-Length", b"2")])
    with pytest.raises(ValueError, match="longer than Content-Length"):
        framer.last(b"abc")
    assert not framer.keep_alive
