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


def message_start(data: bytes | memoryview, completed: int, prefix: bytes = b"") -> int | None:
    """Offset in `data` where the message after the first `completed` ones begins; None if the
    bytes do not replay that way. `prefix + data` starts at a message boundary (the prefix is
    the placeholder method a re-fed request began with).

    Replays in pieces of 512 bytes, then 64, 8 and 1 inside the piece where the count was
    reached (each level re-feeds the known prefix in one call): a few C-speed passes and a few
    dozen Python calls, whatever the size of `data`.
    """
    if not completed:
        return 0
    lo = 0  # data[:lo] completes fewer than `completed` messages
    piece = 512
    while True:
        counter = _Counter()
        p = llhttp(counter)
        at = lo
        try:
            if prefix:
                p.feed_data(prefix)
            if lo:
                p.feed_data(data[:lo])
            while at < len(data):
                p.feed_data(data[at : at + piece])
                if counter.done >= completed:
                    break
                at += piece
        except HttpParserError:
            pass  # the refused message itself (or bad bytes): the count says where we are
        if counter.done < completed:
            return None
        if piece == 1:
            return at + 1 if counter.done == completed else None
        lo = at
        piece //= 8
