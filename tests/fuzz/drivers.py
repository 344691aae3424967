"""Run bytes through refork's RequestParser or through h11, and reduce both to one comparable shape.

An :class:`Outcome` is what a server would act on: the messages framed so far (head as received,
body bytes, the offset where each one ended) and how the stream stands after the last byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import h11

from refork.http.events import Body, EndOfMessage, Event, ParseError, Request
from refork.http.parser import RequestParser

Verdict = Literal["open", "closed", "rejected"]


@dataclass
class Message:
    method: bytes
    target: bytes
    version: str  # "1.0" / "1.1": a 1.x above 1.1 is read as 1.1 (RFC 9112 2.3)
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    end: int | None = None  # offset just past the message, None while incomplete


@dataclass
class Outcome:
    messages: list[Message] = field(default_factory=list)
    verdict: Verdict = "open"
    status: int | None = None  # with "rejected"

    @property
    def complete(self) -> list[Message]:
        return [m for m in self.messages if m.end is not None]


def normal_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Transfer-coding names are case-insensitive (RFC 9112 7) and h11 lower-cases them."""
    return [(n, v.lower() if n == b"transfer-encoding" else v) for n, v in headers]


def feed_refork(raw: bytes, cuts: list[int]) -> tuple[list[Event], ParseError | None]:
    """Feed raw in the pieces cuts delimit; the events seen and the ParseError, if any.

    Checks the parser's contract on the way: only ParseError escapes, and once raised it is
    raised again for any later bytes, with no event.
    """
    parser = RequestParser()
    events: list[Event] = []
    bounds = [0, *cuts, len(raw)]
    for start, end in zip(bounds, bounds[1:], strict=False):
        try:
            events.extend(parser.feed(raw[start:end]))
        except ParseError as error:
            for more in (raw[end:], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"):
                try:
                    after = parser.feed(more)
                except ParseError as again:
                    assert again is error, (again, error)
                else:
                    raise AssertionError(f"feed() after {error!r} returned {after!r}")
            return events, error
    return events, None


def merge_bodies(events: list[Event]) -> list[Event]:
    """Adjacent Body events as one: how a body is cut into events is not framing."""
    merged: list[Event] = []
    for event in events:
        if isinstance(event, Body) and merged and isinstance(merged[-1], Body):
            merged[-1] = Body(merged[-1].data + event.data)
        else:
            merged.append(event)
    return merged


def check_event_grammar(events: list[Event], error: ParseError | None) -> None:
    """(Request Body* EndOfMessage)* [Request Body*]; nothing after a closing request."""
    expecting_head = True
    closed = False
    request: Request | None = None
    received = 0
    for event in events:
        assert not closed, f"{event!r} after a request that closes the connection"
        if isinstance(event, Request):
            assert expecting_head, f"{event!r} inside another message"
            assert event.http_version in ("1.0", "1.1")
            assert not (event.chunked and event.content_length is not None)
            request, received, expecting_head = event, 0, False
        elif isinstance(event, Body):
            assert request is not None and not expecting_head, f"{event!r} outside a message"
            assert event.data, "empty Body event"
            received += len(event.data)
        else:
            assert request is not None and not expecting_head, f"{event!r} outside a message"
            if not request.chunked:
                assert received == (request.content_length or 0), (request, received)
            expecting_head, closed = True, not request.keep_alive
    if error is not None:
        assert 400 <= error.status <= 599, error


def refork_outcome(raw: bytes) -> Outcome:
    """refork's reading of raw, fed one byte at a time so every message's end offset is known."""
    parser = RequestParser()
    out = Outcome()
    current: Message | None = None
    keep_alive = True
    for i in range(len(raw)):
        try:
            events = parser.feed(raw[i : i + 1])
        except ParseError as error:
            out.verdict, out.status = "rejected", error.status
            return out
        for event in events:
            if isinstance(event, Request):
                current = Message(
                    event.method.encode(), event.target, event.http_version, normal_headers(event.headers)
                )
                out.messages.append(current)
                keep_alive = event.keep_alive
            elif isinstance(event, Body):
                assert current is not None
                current.body += event.data
            elif isinstance(event, EndOfMessage):
                assert current is not None
                current.end = i + 1
                if not keep_alive:  # the parser ignores what follows
                    out.verdict = "closed"
                    return out
    return out


def h11_outcome(raw: bytes) -> Outcome:
    """h11's reading of raw (as a server), one byte at a time; every request is answered 404.

    404 is a refusal both for Upgrade (not 101) and for CONNECT (not 2xx), so h11 goes on
    parsing HTTP after either, as refork does.
    """
    conn = h11.Connection(our_role=h11.SERVER)
    out = Outcome()
    current: Message | None = None
    for i in range(len(raw)):
        conn.receive_data(raw[i : i + 1])
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as error:
                out.verdict, out.status = "rejected", error.error_status_hint
                return out
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Request):
                version = event.http_version.decode()
                current = Message(
                    event.method,
                    event.target,
                    "1.1" if version.startswith("1.") and version != "1.0" else version,
                    normal_headers(list(event.headers)),
                )
                out.messages.append(current)
            elif isinstance(event, h11.Data):
                assert current is not None
                current.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert current is not None
                current.end = i + 1
                conn.send(h11.Response(status_code=404, headers=[("Content-Length", "0")]))
                conn.send(h11.EndOfMessage())
                if h11.MUST_CLOSE in conn.states.values():
                    out.verdict = "closed"
                    return out
                conn.start_next_cycle()
    return out
