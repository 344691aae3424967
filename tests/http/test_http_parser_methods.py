"""The request line's method and protocol name: token methods llhttp does not know (re-fed with
a placeholder method, replayed from the last message boundary however the reads fall) and
protocol names other than HTTP (RTSP/1.0, ICE/1.0), which llhttp would frame as HTTP/1.0."""

from __future__ import annotations

import pytest
from support.http_vectors import EOM, TE, H, P, merge_bodies, req
from support.parsing import parse

from refork.http.events import Body, EndOfMessage, Event, ParseError, Request
from refork.http.parser import Limits, RequestParser

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
