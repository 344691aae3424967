"""Run bytes through refork's RequestParser or through h11, and reduce both to one comparable shape.

An :class:`Outcome` is what a server would act on: the messages framed so far (head as received,
body bytes, the offset where each one ended) and how the stream stands after the last byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import h11

from refork.http.events import Body, EndOfMessage, Event, ParseError, Request
from refork.http.parser import Limits, RequestParser

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


ABSOLUTE_FORM = re.compile(rb"(?i)https?://([^/?#]+)")


def host_from_target(target: bytes, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """RFC 9112 3.2.2 for an absolute-form target: an origin server MUST ignore the received Host
    and use the target's authority. h11 leaves that duty to the server above it; this is that
    server's part, so h11's reading compares with refork's (which does it in the parser)."""
    found = ABSOLUTE_FORM.match(target)
    if found is None:
        return headers
    authority = found.group(1)
    replaced = [(n, authority) if n == b"host" else (n, v) for n, v in headers]
    if not any(n == b"host" for n, _ in headers):
        replaced.append((b"host", authority))  # HTTP/1.0 without Host: the target names it
    return replaced


def feed_refork(
    raw: bytes, cuts: list[int], limits: Limits = Limits()
) -> tuple[list[Event], ParseError | None]:
    """Feed raw in the pieces cuts delimit; the events seen and the ParseError, if any.

    Checks the parser's contract on the way: only ParseError escapes, and once raised it is
    raised again for any later bytes, with no event.
    """
    parser = RequestParser(limits)
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
                    host_from_target(event.target, normal_headers(list(event.headers))),
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


def is_prefix(short: list[Event], full: list[Event]) -> bool:
    """short is what a coarser feeding saw before its error: full's start, the last Body cut short."""
    if not short:
        return True
    if len(short) > len(full) or short[:-1] != full[: len(short) - 1]:
        return False
    last, other = short[-1], full[len(short) - 1]
    if isinstance(last, Body) and isinstance(other, Body):
        return other.data.startswith(last.data)
    return last == other


@dataclass(frozen=True)
class Divergence:
    kind: Literal["framing", "refork refuses", "h11 refuses"]
    index: int  # the message where the two readings part
    start: int  # where that message starts (the end of the last one both framed alike)
    prev_start: int


def divergence(refork: Outcome, h11: Outcome) -> Divergence | None:
    """Where, and how, the two readings first differ; None if they agree.

    A side still reading a message has not accepted it yet: h11 checks a line once it is whole,
    llhttp byte by byte, so an early refusal by one while the other waits is no disagreement,
    unless the waiting side already accepted that message's head.
    """

    def at(i: int, kind: Literal["framing", "refork refuses", "h11 refuses"]) -> Divergence:
        ends = [0, 0] + [m.end or 0 for m in refork.messages[:i]]
        return Divergence(kind, i, ends[-1], ends[-2])

    for i in range(max(len(refork.messages), len(h11.messages))):
        r = refork.messages[i] if i < len(refork.messages) else None
        e = h11.messages[i] if i < len(h11.messages) else None
        if r == e:
            continue
        r_done, e_done = r is not None and r.end is not None, e is not None and e.end is not None
        r_refuses = not r_done and refork.verdict != "open"
        e_refuses = not e_done and h11.verdict != "open"
        if r_refuses and e_refuses:
            return None  # both refuse this message (how far each read into it is no framing)
        if r_refuses:
            return at(i, "refork refuses") if e_done or r is None else None
        if e_refuses:
            return at(i, "h11 refuses") if r_done or e is None else None
        if r is None:  # refork still waits for a head h11 has read whole
            return at(i, "refork refuses")
        if e is None:
            return at(i, "h11 refuses")
        return at(i, "framing")
    return None  # the same messages; what follows is refused, or still being read, by either


def accepts(outcome: Outcome, raw: bytes) -> bool:
    """No byte of raw refused: every message read whole, or the last one's head read and its body
    still coming."""
    if outcome.verdict == "rejected" or not outcome.messages:
        return False
    last = outcome.messages[-1]
    return last.end == len(raw) or (last.end is None and outcome.verdict == "open")
