"""The sans-IO request parser: a corpus of good and bad requests, fed whole and byte by byte.

Every rejection here was checked against real llhttp behaviour; the module docstring of
refork.http.head lists which ones llhttp does itself and which ones refork adds.
"""

from __future__ import annotations

import pytest
from support.head_lines import HEAD, HEAD_LINES
from support.http_vectors import EOM, INVALID, TE, VALID, H, P, merge_bodies, req

from refork.http.events import Body, EndOfMessage, Event, ParseError, Request
from refork.http.parser import ARRIVING, Limits, RequestParser


def parse(raw: bytes, *, split: bool = False, limits: Limits = Limits()) -> list:
    """All events for raw, fed at once or one byte per feed(); Body pieces are merged."""
    parser = RequestParser(limits)
    if split:
        events = [e for i in range(len(raw)) for e in parser.feed(raw[i : i + 1])]
    else:
        events = parser.feed(raw)
    return merge_bodies(events)


def status_of(raw: bytes, *, split: bool = False, limits: Limits = Limits()) -> int:
    with pytest.raises(ParseError) as info:
        parse(raw, split=split, limits=limits)
    return info.value.status


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


# --- the protocol name (RFC 9112 2.3: HTTP-name is "HTTP") ------------------------------------

OTHER_PROTOCOL = [
    b"GET / RTSP/1.0\r\n\r\n",
    b"POST / RTSP/1.0\r\nContent-Length: 2\r\n\r\nab",
    b"OPTIONS * RTSP/1.0\r\n\r\n",
    b"GET  /x  RTSP/1.0\r\n\r\n",
    b"\r\nGET / RTSP/1.0\r\n\r\n",
    b"DESCRIBE / RTSP/1.0\r\n\r\n",
    b"SOURCE / ICE/1.0\r\n\r\n",
    b"GET / RTSP/1.1\r\nHost: a\r\n\r\n",
]


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("raw", OTHER_PROTOCOL)
def test_another_protocol_name_is_refused(raw: bytes, split: bool) -> None:
    """llhttp frames RTSP/1.0 and ICE/1.0 as HTTP/1.0 without saying which name it saw."""
    with pytest.raises(ParseError) as info:
        parse(raw, split=split)
    assert (info.value.status, info.value.reason, info.value.events) == (400, "protocol is not HTTP", [])


@pytest.mark.parametrize("cut", [None, 1, 20, 30, 40, 45, 50])
@pytest.mark.parametrize(
    "first",
    [
        H + b"\r\n",
        b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\n",
        P + b"Content-Length: 16\r\n\r\nGET / RTSP/1.0\r\n",
    ],
    ids=["get", "unknown-method", "body-like-a-request-line"],
)
def test_another_protocol_name_pipelined_is_refused_after_the_first_is_answered(
    first: bytes, cut: int | None
) -> None:
    raw = first + b"GET / RTSP/1.0\r\n\r\n" + H + b"\r\n"
    parser = RequestParser()
    events: list[Event] = []
    with pytest.raises(ParseError) as info:
        for piece in (raw,) if cut is None else (raw[:cut], raw[cut:]):
            events += parser.feed(piece)
    events += info.value.events
    assert info.value.status == 400
    assert [type(e) for e in merge_bodies(events)] == [
        Request,
        *([Body] if b"RTSP" in first else []),
        EndOfMessage,
    ]


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
def test_http_requests_that_mention_rtsp_are_served(split: bool) -> None:
    raw = (
        b"GET /RTSP/1.0 HTTP/1.1\r\nHost: a\r\nX-A: GET / RTSP/1.0\r\n\r\n"
        + b"SOURCE /ICE/1.0 HTTP/1.1\r\nHost: a\r\n\r\n"
        + P + b"Content-Length: 16\r\n\r\nGET / RTSP/1.0\r\n"
        + b"OPTIONS * HTTP/1.1\r\nHost: a\r\nX: ICE/\r\n\r\n"
    )  # fmt: skip
    events = parse(raw, split=split)
    assert [e.method for e in events if isinstance(e, Request)] == ["GET", "SOURCE", "POST", "OPTIONS"]
    assert Body(b"GET / RTSP/1.0\r\n") in events


def test_another_protocol_name_behind_a_long_body_over_several_reads() -> None:
    """More than _MAX_HELD bytes since the last boundary: no replay, the rough reading decides."""
    body = b"RTSP/" + b"x" * 100_000
    for second, refused in ((b"GET / RTSP/1.0\r\n\r\n", True), (H + b"X: RTSP/\r\n\r\n", False)):
        parser = RequestParser()
        parser.feed(P + b"Content-Length: %d\r\n\r\n" % len(body) + body[:70_000])
        if refused:
            with pytest.raises(ParseError) as info:
                parser.feed(body[70_000:] + second)
            assert info.value.status == 400 and [type(e) for e in info.value.events] == [Body, EndOfMessage]
        else:
            assert [type(e) for e in parser.feed(body[70_000:] + second)] == [
                Body,
                EndOfMessage,
                Request,
                EOM.__class__,
            ]


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


# --- methods ----------------------------------------------------------------------------------


def test_unknown_methods_pipelined_after_other_requests() -> None:
    raw = (
        H + b"\r\n"
        + P + b"Content-Length: 5\r\n\r\nX-SYN"
        + b"X-SYNC /1 HTTP/1.1\r\nHost: a\r\n\r\n"
        + TE + b"\r\n1\r\nz\r\n0\r\n\r\n"
        + b"PURGEX /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nq"
        + b"\r\nM-SEARCH /3 HTTP/1.1\r\nHost: a\r\n\r\n"
        + b"UNBIND /4 HTTP/1.1\r\nHost: a\r\n\r\n"
    )  # fmt: skip
    events = parse(raw)
    assert [(e.method, e.path) for e in events if isinstance(e, Request)] == [
        ("GET", b"/"),
        ("POST", b"/"),
        ("X-SYNC", b"/1"),
        ("POST", b"/"),
        ("PURGEX", b"/2"),
        ("M-SEARCH", b"/3"),
        ("UNBIND", b"/4"),
    ]
    assert [e.data for e in events if isinstance(e, Body)] == [b"X-SYN", b"z", b"q"]
    assert sum(1 for e in events if e == EOM) == 7


def test_unknown_method_arriving_in_pieces() -> None:
    parser = RequestParser()
    assert parser.feed(b"X-") == [] and parser.in_message
    assert parser.feed(b"SY") == []
    assert parser.feed(b"NC / HTTP/1.1\r\nHost: a\r\n\r\n") == [req(method="X-SYNC"), EOM]
    assert parser.feed(H + b"\r\n") == [req(), EOM]


UNKNOWN_PIPELINES = {
    "unknown-then-http12": b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.2\r\nHost: a\r\n\r\n",
    "known-then-unknown": H + b"\r\n" + b"X-SYNC /1 HTTP/1.1\r\nHost: a\r\n\r\n",
    "unknown-twice": b"X-SYNC /1 HTTP/1.1\r\nHost: a\r\n\r\nX-SYNC /2 HTTP/1.1\r\nHost: a\r\n\r\n",
    "unknown-with-bodies": b"X-SYNC /1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi"
    + TE
    + b"\r\n1\r\nz\r\n0\r\n\r\n"
    + b"\r\nX-SYNC /2 HTTP/1.1\r\nHost: a\r\n\r\n",
    "unknown-known-unknown": b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\n"
    + H
    + b"\r\n"
    + b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\n",
}
THREE_WAY = ("unknown-then-http12", "unknown-known-unknown")  # every cut in three pieces, too


def _feed_pieces(raw: bytes, cuts: tuple[int, ...]) -> list:
    parser = RequestParser()
    bounds = (0, *cuts, len(raw))
    events = [e for a, b in zip(bounds, bounds[1:], strict=False) for e in parser.feed(raw[a:b])]
    return merge_bodies(events)  # Body pieces depend on the cuts; the bytes do not


@pytest.mark.parametrize("name", UNKNOWN_PIPELINES)
def test_unknown_methods_pipelined_split_at_every_offset(name: str) -> None:
    """Where the reads end must not matter: every cut in two pieces, and in three for the
    shortest pipeline, gives the events of one whole feed (what a socket may deliver)."""
    raw = UNKNOWN_PIPELINES[name]
    whole = _feed_pieces(raw, ())
    assert sum(1 for e in whole if e == EOM) == 2 or name in ("unknown-with-bodies", "unknown-known-unknown")
    for i in range(len(raw) + 1):
        assert _feed_pieces(raw, (i,)) == whole, i
    if name in THREE_WAY:
        for i in range(len(raw) + 1):
            for j in range(i, len(raw) + 1):
                assert _feed_pieces(raw, (i, j)) == whole, (i, j)


def test_unknown_method_is_not_connect_or_upgrade() -> None:
    """The placeholder llhttp sees must not change framing: a body after it is still a body."""
    (request, body, end) = parse(
        b"X-CONNECT a:443 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi".replace(b"a:443", b"/")
    )
    assert request.method == "X-CONNECT" and body == Body(b"hi") and end == EOM


def test_unknown_method_split_inside_a_known_prefix() -> None:
    """llhttp consumed "PU" as the start of PUT/PURGE in an earlier read: the held bytes of that
    read are replayed with the next one, so "PUX" split there is served like "PUX" whole."""
    parser = RequestParser()
    assert parser.feed(b"PU") == []
    assert parser.feed(b"X / HTTP/1.1\r\nHost: a\r\n\r\n") == [req(method="PUX"), EOM]
    assert parse(b"PUX / HTTP/1.1\r\nHost: a\r\n\r\n")[0].method == "PUX"


def test_a_streamed_body_is_not_held_for_a_replay() -> None:
    """Held bytes are bounded: after a body longer than that, a pipelined unknown method in
    the read that ends the body is refused (400), as llhttp alone would."""
    parser = RequestParser()
    parser.feed(P + b"Content-Length: 100000\r\n\r\n")
    for _ in range(99):
        parser.feed(b"b" * 1000)
    with pytest.raises(ParseError) as info:
        parser.feed(b"b" * 1000 + b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\n")
    assert info.value.status == 400 and [type(e) for e in info.value.events] == [Body, EndOfMessage]


def test_an_endless_method_is_refused() -> None:
    parser = RequestParser(Limits(max_request_line=100))
    with pytest.raises(ParseError) as info:
        for _ in range(100):
            parser.feed(b"X" * 10)
    assert info.value.status == 414


def test_parse_error_carries_the_complete_requests_before_it() -> None:
    """valid, invalid, valid in one read: the loop can answer the first before the 400."""
    raw = H + b"\r\n" + P + b"Content-Length: 2\r\n\r\nhi" + b"GET / HTTP/1.1\r\nHost a\r\n\r\n" + H + b"\r\n"
    with pytest.raises(ParseError) as info:
        RequestParser().feed(raw)
    assert info.value.status == 400
    assert [type(e) for e in info.value.events] == [Request, EndOfMessage, Request, Body, EndOfMessage]
    with pytest.raises(ParseError) as info:  # an error inside a chunked body: its Request is not included
        RequestParser().feed(H + b"\r\n" + TE + b"\r\nzz\r\n")
    assert [type(e) for e in info.value.events] == [Request, EndOfMessage]


def test_message_start_finds_every_boundary() -> None:
    """The replay that locates a request with an unknown method, against the known boundaries."""
    from refork.http.llhttp import message_start

    messages = [
        H + b"\r\n",
        P + b"Content-Length: 700\r\n\r\n" + b"b" * 700,
        TE + b"\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
        b"GET /" + b"p" * 1500 + b" HTTP/1.1\r\nHost: a\r\n\r\n",
        H + b"\r\n",
    ]
    data = b"".join(messages) + b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\n"
    ends = [sum(len(m) for m in messages[: i + 1]) for i in range(len(messages))]
    assert message_start(data, 0) == 0
    for completed, end in enumerate(ends, start=1):
        assert message_start(data, completed) == end
    assert message_start(data, len(messages) + 1) is None


def test_thousands_of_pipelined_unknown_methods_in_one_feed() -> None:
    """One read full of them: re-fed in a loop (no recursion limit), every one framed right."""
    one = b"X-SYNC /%d HTTP/1.1\r\nHost: a\r\n\r\n"
    data = b"".join(one % i for i in range(3000)) + P + b"Content-Length: 1\r\n\r\nz"
    events = RequestParser().feed(data)
    requests = [e for e in events if isinstance(e, Request)]
    assert len(requests) == 3001 and sum(1 for e in events if e == EOM) == 3001
    assert [r.method for r in requests[:3]] == ["X-SYNC"] * 3 and requests[-1].method == "POST"
    assert [r.path for r in requests[:3]] == [b"/0", b"/1", b"/2"] and events[-2] == Body(b"z")


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


@pytest.mark.parametrize("split", [False, True], ids=["whole", "bytewise"])
def test_rtsp_methods_with_http_are_token_methods(split: bool) -> None:
    """llhttp refuses DESCRIBE, PLAY, GET_PARAMETER... with HTTP/ (it knows them as RTSP's): to
    RFC 9110 9.1 they are tokens like any other, re-fed with the placeholder method."""
    raw = (
        b"DESCRIBE /x HTTP/1.1\r\nHost: a\r\n\r\n"
        + H
        + b"\r\n"
        + b"GET_PARAMETER /y HTTP/1.1\r\nHost: a\r\n\r\n"
    )
    events = parse(raw, split=split)
    assert [(e.method, e.path) for e in events if isinstance(e, Request)] == [
        ("DESCRIBE", b"/x"),
        ("GET", b"/"),
        ("GET_PARAMETER", b"/y"),
    ]


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
