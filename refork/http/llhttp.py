"""llhttp (through httptools) as refork.http.parser uses it, and replaying bytes through it.

httptools reports no byte offsets (except for upgrades), so where the parser must know where a
request began in a buffer (to re-feed a request with an unknown method) it replays the bytes
through a scratch llhttp that only counts completed messages.
"""

from __future__ import annotations

from httptools import HttpParserError, HttpRequestParser


def llhttp(callbacks: object) -> HttpRequestParser:
    """A strict llhttp parser, except for the version digits: HTTP/1.x is the caller's to judge."""
    p = HttpRequestParser(callbacks)
    p.set_dangerous_leniencies(lenient_version=True)
    return p


class _Counter:
    """llhttp callbacks that only count completed messages (see message_start)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = 0

    def on_message_complete(self) -> None:
        self.done += 1


def message_start(data: bytes, completed: int, piece: int = 512) -> int | None:
    """Offset in `data` (which starts at a message boundary) where the message after the first
    `completed` ones begins; None if the bytes do not replay that way.

    Pieces first, then byte by byte through the one piece where the count is reached, so the
    cost stays linear in len(data).
    """
    if not completed:
        return 0
    counter = _Counter()
    p = llhttp(counter)
    at = 0
    try:
        while at < len(data):
            p.feed_data(data[at : at + piece])
            if counter.done >= completed:
                break
            at += piece
    except HttpParserError:
        pass
    if counter.done < completed:
        return None
    counter = _Counter()
    p = llhttp(counter)
    try:
        p.feed_data(data[:at])
        while counter.done < completed and at < len(data):
            p.feed_data(data[at : at + 1])
            at += 1
    except HttpParserError:
        return None
    return at if counter.done == completed else None
