"""The sans-IO request parser: a corpus of good and bad requests, fed whole and byte by byte,
pipelining and keep-alive, and the limits on the request line, the head and the body.

Every rejection here was checked against real llhttp behaviour; the module docstring of
refork.http.head lists which ones llhttp does itself and which ones refork adds. The methods and
protocol names llhttp does not know: test_http_parser_methods.py; chunked framing:
test_http_parser_chunked.py.
"""

from __future__ import annotations

import pytest
from support.head_lines import HEAD, HEAD_LINES
from support.http_vectors import EOM, INVALID, TE, VALID, H, P, req
from support.parsing import parse, status_of

from refork.http.events import Body, EndOfMessage, ParseError, Request
from refork.http.parser import ARRIVING, Limits, RequestParser


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize(("name", "raw", "status"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_requests_never_produce_a_request(name: str, raw: bytes, status: int, split: bool) -> None:
    parser = RequestParser()
    seen: list = []
    with pytest.raises(ParseError) as info:
        for piece in [raw[i : i + 1] for i in range(len(raw))] if split else [raw]:
            seen.extend(parser.feed(piece))
    assert info.value.status == status, info.value
    assert not [e for e in seen if isinstance(e, EndOfMessage)]
    if not name.startswith(("chunk-", "trailer-")):
        assert not [e for e in seen if isinstance(e, Request)]
    with pytest.raises(ParseError):  # unusable afterwards
        parser.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize(("name", "raw", "expected"), VALID, ids=[c[0] for c in VALID])
def test_valid_requests(name: str, raw: bytes, expected: list, split: bool) -> None:
    assert parse(raw, split=split) == expected


def test_pipelined_requests_in_one_feed_and_bytewise() -> None:
    raw = (
        H + b"\r\n"
        + P + b"Content-Length: 3\r\n\r\nabc"
        + TE + b"\r\n2\r\nxy\r\n0\r\n\r\n"
        + b"HEAD /h HTTP/1.1\r\nHost: a\r\n\r\n"
    )  # fmt: skip
    for split in (False, True):
        events = parse(raw, split=split)
        kinds = [type(e).__name__ for e in events]
        assert kinds == ["Request", "EndOfMessage", "Request", "Body", "EndOfMessage"] * 1 + [
            "Request",
            "Body",
            "EndOfMessage",
            "Request",
            "EndOfMessage",
        ]
        assert [e.method for e in events if isinstance(e, Request)] == ["GET", "POST", "POST", "HEAD"]
        assert [e.data for e in events if isinstance(e, Body)] == [b"abc", b"xy"]


def test_in_message_tracks_one_request() -> None:
    parser = RequestParser()
    assert not parser.in_message
    assert parser.feed(b"POST / HTTP/1.1\r\n") == []
    assert parser.in_message
    events = parser.feed(b"Host: a\r\nContent-Length: 4\r\n\r\nab")
    assert [type(e) for e in events] == [Request, Body]
    assert parser.in_message
    assert parser.feed(b"cd") == [Body(b"cd"), EOM]
    assert not parser.in_message
    assert parser.feed(b"") == []


def test_bytes_after_a_closing_request_are_ignored() -> None:
    parser = RequestParser()
    events = parser.feed(H + b"Connection: close\r\n\r\n" + H + b"\r\n")
    assert [type(e) for e in events] == [Request, EndOfMessage]
    assert not events[0].keep_alive
    assert parser.feed(b"garbage") == []
    parser = RequestParser()
    events = parser.feed(b"GET / HTTP/1.0\r\n\r\nGET / HTTP/1.0\r\n\r\n")
    assert [type(e) for e in events] == [Request, EndOfMessage]


@pytest.mark.parametrize(
    "after",
    [
        b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
    ids=["valid", "invalid"],
)
def test_what_follows_a_close_llhttp_would_keep_alive_is_ignored_in_one_feed(after: bytes) -> None:
    """HTTP/1.0 with `keep-alive, close` closes (RFC 9112 9.3) though llhttp would keep it alive:
    found by the fuzz test, where whole and byte-wise feeding disagreed."""
    closing = b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n"
    for cut in (len(closing), len(closing + after)):
        parser = RequestParser()
        events = parser.feed((closing + after)[:cut]) + parser.feed((closing + after)[cut:])
        assert [type(e) for e in events] == [Request, EndOfMessage]
        assert not events[0].keep_alive


def test_http10_keep_alive_pipelines() -> None:
    raw = b"GET /1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n"
    requests = [e for e in parse(raw) if isinstance(e, Request)]
    assert [(r.path, r.keep_alive) for r in requests] == [(b"/1", True), (b"/2", False)]


def test_error_after_a_good_pipelined_request_still_raises() -> None:
    with pytest.raises(ParseError):
        RequestParser().feed(H + b"\r\n" + b"GET / HTTP/1.1\r\n\r\n")


def test_method_strings() -> None:
    for method in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "PROPFIND", "PURGE"):
        (request, _) = parse(H.replace(b"GET", method.encode()) + b"\r\n")
        assert request.method == method


# --- limits ---------------------------------------------------------------------------------


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
def test_request_line_limit(split: bool) -> None:
    limits = Limits(max_request_line=100)
    ok = b"GET /" + b"a" * (100 - 14) + b" HTTP/1.1\r\nHost: a\r\n\r\n"  # line is exactly 100 bytes
    assert len(ok.split(b"\r\n")[0]) == 100
    assert isinstance(parse(ok, split=split, limits=limits)[0], Request)
    too_long = ok.replace(b"/a", b"/aa")
    assert status_of(too_long, split=split, limits=limits) == 414
    assert status_of(b"GET /" + b"a" * 10_000, split=split, limits=limits) == 414  # before the end


def test_header_count_limit() -> None:
    limits = Limits(max_header_count=3)
    assert isinstance(parse(H + b"A: 1\r\nB: 2\r\n\r\n", limits=limits)[0], Request)
    assert status_of(H + b"A: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits=limits) == 431


def test_header_size_limit() -> None:
    limits = Limits(max_header_size=20)
    assert isinstance(parse(H + b"X-Name: " + b"v" * 14 + b"\r\n\r\n", limits=limits)[0], Request)
    assert status_of(H + b"X-Name: " + b"v" * 15 + b"\r\n\r\n", limits=limits) == 431


def test_endless_header_is_cut_off_before_it_ends() -> None:
    """llhttp buffers a field until its end: the whole-head bound must stop an endless one."""
    parser = RequestParser(Limits(max_request_line=100, max_header_count=2, max_header_size=100))
    parser.feed(H + b"X: ")
    with pytest.raises(ParseError) as info:
        for _ in range(1000):
            parser.feed(b"v" * 100)
    assert info.value.status == 431


@pytest.mark.parametrize(("name", "raw", "status", "rest"), HEAD_LINES, ids=[v[0] for v in HEAD_LINES])
@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
def test_a_line_is_bounded_as_it_arrives(name: str, raw: bytes, status: int | None, rest: bytes,
                                         split: bool) -> None:  # fmt: skip
    """A line past its limit is refused once that many bytes came without its end (the same table
    runs on every request path: tests/promises/test_promises_memory.py)."""
    parser = RequestParser()
    pieces = [raw[i : i + 1] for i in range(len(raw))] if split else [raw]
    try:
        for piece in pieces:
            assert parser.feed(piece) == []
    except ParseError as error:  # (a long target: refused by on_url as its pieces come, too)
        assert error.status == status and (ARRIVING in error.reason or status == 414), (error, status)
        return
    assert status is None, f"not refused: {name}"
    assert parser.head_held >= len(raw) - 2 and parser.buffered >= parser.head_held
    events = parser.feed(rest)
    assert isinstance(events[0], Request) and parser.head_held == 0


def test_a_line_past_its_limit_after_a_pipelined_request_in_the_same_read_is_refused_in_the_next() -> None:
    """Where a head began is not known when other messages came first in the read: it is measured
    from its last LF only, and refused at the next read (a read's worth later at most)."""
    parser = RequestParser()
    body = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
    events = parser.feed(body + HEAD + b"X-Long: " + b"v" * 9000)
    assert [type(e) for e in events] == [Request, Body, EndOfMessage]
    with pytest.raises(ParseError) as refused:
        parser.feed(b"v")
    assert refused.value.status == 431


def test_trailer_limits() -> None:
    limits = Limits(max_header_count=3, max_header_size=20)
    many = TE + b"\r\n0\r\n" + b"".join(b"T%d: v\r\n" % i for i in range(4)) + b"\r\n"
    assert status_of(many, limits=limits) == 431
    assert status_of(TE + b"\r\n0\r\nT: " + b"v" * 30 + b"\r\n\r\n", limits=limits) == 431


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
def test_body_limit(split: bool) -> None:
    limits = Limits(max_body=5)
    assert parse(P + b"Content-Length: 5\r\n\r\nhello", split=split, limits=limits)[1] == Body(b"hello")
    assert status_of(P + b"Content-Length: 6\r\n\r\n", split=split, limits=limits) == 413
    assert parse(TE + b"\r\n5\r\nhello\r\n0\r\n\r\n", split=split, limits=limits)[1] == Body(b"hello")
    assert status_of(TE + b"\r\n3\r\nhel\r\n3\r\nlo!\r\n0\r\n\r\n", split=split, limits=limits) == 413


def test_zero_means_unlimited() -> None:
    limits = Limits(max_request_line=0, max_header_count=0, max_header_size=0, max_body=0)
    raw = b"POST /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: a\r\n" + b"X: 1\r\n" * 300
    raw += b"Content-Length: 3\r\n\r\nabc"
    assert [type(e) for e in parse(raw, limits=limits)] == [Request, Body, EndOfMessage]


def test_feed_accepts_bytearray_and_memoryview() -> None:
    raw = P + b"Connection: upgrade\r\nUpgrade: x\r\nContent-Length: 2\r\n\r\nab" + H + b"\r\n"
    for wrap in (bytearray, memoryview):
        events = RequestParser().feed(wrap(raw))
        assert [type(e) for e in events] == [Request, Body, EndOfMessage, Request, EndOfMessage]
        assert events[1] == Body(b"ab") and type(events[1].data) is bytes


def test_expect_continue_with_chunked_body() -> None:
    (request, *_) = parse(TE + b"Expect: 100-continue\r\n\r\n0\r\n\r\n")
    assert request.expect_continue and request.chunked


def test_upgrade_body_split_across_feeds() -> None:
    parser = RequestParser()
    head = P + b"Connection: upgrade\r\nUpgrade: x\r\nContent-Length: 4\r\n\r\n"
    assert [type(e) for e in parser.feed(head + b"a")] == [Request, Body]
    assert parser.in_message
    assert parser.feed(b"bc") == [Body(b"bc")]
    assert parser.feed(b"d" + H + b"\r\n") == [Body(b"d"), EOM, req(), EOM]
    assert not parser.in_message


def test_known_llhttp_leniencies_are_pinned() -> None:
    """Documented in refork.http.parser: accepted, harmless. A change here means llhttp moved."""
    (request, _) = parse(b"GET  /x  HTTP/1.1\r\nHost: a\r\n\r\n")
    assert request.path == b"/x"
