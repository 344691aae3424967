"""Chunked framing: endless trailers and chunk extensions refused as they arrive, and chunk
extensions with BWS (RFC 9112 7.1.1), read by refork.http.chunked, served within the same bounds."""

from __future__ import annotations

import pytest
from support.http_vectors import EOM, TE, H, merge_bodies, req
from support.parsing import parse, status_of

from refork.http.events import Body, EndOfMessage, Event, ParseError, Request
from refork.http.parser import Limits, RequestParser

# --- bounded chunked framing (issue 8) ------------------------------------------------------


def test_endless_trailer_value_is_refused_while_it_arrives() -> None:
    """An endless trailer is counted as it arrives (llhttp/httptools would buffer it whole)."""
    parser = RequestParser()
    parser.feed(TE + b"\r\n0\r\nX-T: ")
    sent = 0
    with pytest.raises(ParseError) as info:
        while sent < 20_000_000:
            parser.feed(b"A" * 65536)
            sent += 65536
    assert info.value.status == 431
    assert sent < 2 * Limits().max_request_line + 100 * (Limits().max_header_size + 4)


def test_endless_trailer_section_of_small_fields_is_refused() -> None:
    parser = RequestParser(Limits(max_header_count=1000))
    parser.feed(TE + b"\r\n0\r\n")
    with pytest.raises(ParseError) as info:
        for i in range(10_000):
            parser.feed(b"T%d: v\r\n" % i)
    assert info.value.status == 431


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
def test_endless_chunk_extension_is_refused(split: bool) -> None:
    parser = RequestParser()
    parser.feed(TE + b"\r\n5;e=")
    with pytest.raises(ParseError) as info:
        for _ in range(1000):
            if split:
                for _ in range(100):
                    parser.feed(b"A")
            else:
                parser.feed(b"A" * 1000)
    assert info.value.status == 400
    assert "chunk" in info.value.reason


def test_long_but_bounded_chunk_extensions_and_trailers_pass() -> None:
    ext = b";e=" + b"A" * 8000
    raw = TE + b"\r\n5" + ext + b"\r\nhello\r\n3" + ext + b"\r\nabc\r\n0" + ext + b"\r\nX-T: " + b"t" * 8000
    raw += b"\r\n\r\n" + H + b"\r\n"
    for split in (False, True):
        events = parse(raw, split=split)
        assert [type(e) for e in events] == [Request, Body, EndOfMessage, Request, EndOfMessage]
        assert events[1] == Body(b"helloabc")
        assert events[3].headers == [(b"host", b"a")]


def test_chunked_bodies_bigger_than_the_head_limit_are_not_counted_as_heads() -> None:
    limits = Limits(max_request_line=100, max_header_count=2, max_header_size=100)
    parser = RequestParser(limits)
    assert [type(e) for e in parser.feed(TE + b"\r\n")] == [Request]
    for _ in range(100):
        assert parser.feed(b"400\r\n" + b"x" * 1024 + b"\r\n") == [Body(b"x" * 1024)]
    assert parser.feed(b"0\r\n\r\n") == [EOM]


# --- chunk extensions with BWS (RFC 9112 7.1.1), read by refork.http.chunked ----------------

BWS_LINES = [
    b"5;x =y",
    b"5 ; foo = bar",
    b"5;a = b",
    b'5;a="q v"',
    b"5; a=b",
    b'5\t;\ta\t=\t"x \\" y" ; b ; c=d',
]


@pytest.mark.parametrize("line", BWS_LINES)
def test_chunk_extensions_with_bws_are_served(line: bytes) -> None:
    raw = (
        TE
        + b"\r\n2\r\nhi\r\n"
        + line
        + b"\r\nhello\r\n3 ; x = y\r\nabc\r\n0 ; z = 1\r\nX-T: 1\r\n\r\n"
        + H
        + b"\r\n"
    )
    expected = [
        req(method="POST", headers=[(b"host", b"a"), (b"transfer-encoding", b"chunked")], chunked=True),
        Body(b"hihelloabc"),
        EOM,
        req(),
        EOM,
    ]
    assert parse(raw) == expected
    assert parse(raw, split=True) == expected
    for cut in range(len(TE), len(raw)):  # every split into two reads
        parser = RequestParser()
        assert merge_bodies(parser.feed(raw[:cut]) + parser.feed(raw[cut:])) == expected, cut


def test_chunk_extensions_with_bws_keep_the_bounds() -> None:
    """The line limit (400), the body limit (413) and the trailer limits (431) all still hold."""
    limits = Limits(max_header_size=50, max_body=8)
    assert status_of(TE + b"\r\n5 ; a=" + b"b" * 60 + b"\r\nhello\r\n0\r\n\r\n", limits=limits) == 400
    assert status_of(TE + b"\r\n5 ; a=b\r\nhello\r\n5\r\nhello\r\n0\r\n\r\n", limits=limits) == 413
    assert status_of(TE + b"\r\n9 ; a=b\r\n", limits=limits) == 413
    assert status_of(TE + b"\r\n0 ; a\r\nX-T: " + b"v" * 60 + b"\r\n\r\n", limits=limits) == 431
    parser = RequestParser()
    parser.feed(TE + b"\r\n5 ; e=")
    with pytest.raises(ParseError) as info:
        for _ in range(1000):
            parser.feed(b"A" * 1000)
    assert (info.value.status, info.value.reason) == (400, "chunk-size line too long")


def test_chunk_extensions_with_bws_behind_other_requests_and_unknown_methods() -> None:
    raw = (
        H + b"\r\n"
        + b"X-SYNC / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3 ; a = b\r\nabc\r\n0\r\n\r\n"
        + b"PURGEX /2 HTTP/1.1\r\nHost: a\r\n\r\n"
        + TE + b"\r\n1;q = \"r\"\r\nz\r\n0\r\n\r\n"
        + b"GET /3 RTSP/1.0\r\n\r\n"
    )  # fmt: skip
    for split in (False, True):
        parser = RequestParser()
        events: list[Event] = []
        with pytest.raises(ParseError) as info:
            for piece in (raw,) if not split else [raw[i : i + 1] for i in range(len(raw))]:
                events += parser.feed(piece)
        events = merge_bodies(events + info.value.events)
        assert info.value.status == 400
        assert [(e.method, e.path) for e in events if isinstance(e, Request)] == [
            ("GET", b"/"),
            ("X-SYNC", b"/"),
            ("PURGEX", b"/2"),
            ("POST", b"/"),
        ]
        assert [e.data for e in events if isinstance(e, Body)] == [b"abc", b"z"]


@pytest.mark.parametrize("cut", [1, 2, 9, 30, 10_000, 20_030])
def test_chunk_extensions_with_bws_and_a_big_chunk_across_reads(cut: int) -> None:
    """Once ChunkFraming reads the body, its data is not counted like a chunk-size line."""
    body = b"5 ; a=b\r\nhello\r\n4e20 ; x\r\n" + b"x" * 20_000 + b"\r\n0\r\n\r\n"
    parser = RequestParser()
    events = parser.feed(TE + b"\r\n" + body[:cut])
    events += parser.feed(body[cut : cut + 10_000])
    events += parser.feed(body[cut + 10_000 :])
    events = merge_bodies(events)
    assert [type(e) for e in events] == [Request, Body, EndOfMessage]
    assert events[1] == Body(b"hello" + b"x" * 20_000)
