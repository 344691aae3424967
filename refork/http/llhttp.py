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


# The protocol names llhttp accepts besides HTTP (RFC 9112 2.3 allows only HTTP). It parses
# `RTSP/1.0` with GET, POST, OPTIONS and the RTSP methods, `ICE/1.0` with SOURCE, frames them
# exactly like HTTP/1.x, and does not say which name it saw: the parser looks at the bytes, and
# only when these patterns occur in them (see RequestParser._check_protocol).
OTHER_PROTOCOLS = (b"RTSP/", b"ICE/")
# A read that ends with one of these may hold the start of a protocol name the next read ends.
_PARTIAL = (b"R", b"RT", b"RTS", b"RTSP", b"I", b"IC", b"ICE")
# Methods llhttp accepts only with RTSP/: their request cannot be HTTP.
RTSP_ONLY_METHODS = frozenset(
    b"DESCRIBE ANNOUNCE SETUP PLAY PAUSE TEARDOWN GET_PARAMETER SET_PARAMETER REDIRECT RECORD FLUSH".split()
)


def may_name_other_protocol(data: bytes | bytearray | memoryview, partial: bool = False) -> bool:
    """Whether data holds RTSP/ or ICE/ (with `partial`: or ends with the start of one)."""
    if type(data) is memoryview:
        data = bytes(data)
    if data.find(b"RTSP/") >= 0 or data.find(b"ICE/") >= 0:  # not `in`: see on_headers_complete
        return True
    return partial and data.endswith(_PARTIAL)


def request_protocol(stream: bytes | memoryview, completed: int, prefix: bytes = b"") -> bytes | None:
    """The protocol (`HTTP/1.1`) in the request line of the message after the first `completed`
    ones in `prefix + stream` (which starts at a message boundary); None if it cannot be found."""
    view = memoryview(stream)
    start = message_start(view, completed, prefix)
    if start is None:
        return None
    while start < len(view) and view[start] in b"\r\n":  # empty lines first (RFC 9112 2.2)
        start += 1
    line = bytes(view[start : start + 65536])
    end = line.find(b"\n")
    if end < 0:
        return None
    return line[:end].rstrip(b"\r").rpartition(b" ")[2]


def names_other_protocol(data: bytes | bytearray | memoryview, url: bytes) -> bool:
    """A rougher reading, for when the bytes since the last message boundary are no longer kept:
    whether data holds `SP url SP+` then RTSP/ or ICE/ (what such a request line looks like)."""
    data = bytes(data)
    needle = b" " + url + b" "
    at = data.find(needle)
    while at >= 0:
        after = data[at + len(needle) : at + len(needle) + 64].lstrip(b" ")
        if after.startswith(OTHER_PROTOCOLS):
            return True
        at = data.find(needle, at + 1)
    return False


class _LineCounter(_Counter):
    """Also counts, in the message after the first `completed`, the places where a chunk-size
    line begins: the end of the head and the end of each chunk (see chunk_line_start)."""

    __slots__ = ("marks",)

    def __init__(self) -> None:
        super().__init__()
        self.marks = 0

    def on_message_complete(self) -> None:
        self.done += 1
        self.marks = 0

    def on_headers_complete(self) -> None:
        self.marks += 1

    def on_chunk_complete(self) -> None:
        self.marks += 1


def chunk_line_start(data: bytes | memoryview, completed: int, lines: int, prefix: bytes = b"") -> int | None:
    """Offset in `data` where the `lines`-th chunk-size line (1: the first) of the message after
    the first `completed` ones begins; None if the bytes do not replay that way. `prefix + data`
    starts at a message boundary. Replays like message_start."""

    def reached(c: _LineCounter) -> bool:
        return c.done > completed or (c.done == completed and c.marks >= lines)

    lo = 0
    piece = 512
    while True:
        counter = _LineCounter()
        p = llhttp(counter)
        at = lo
        try:
            if prefix:
                p.feed_data(prefix)
            if lo:
                p.feed_data(data[:lo])
            while at < len(data):
                p.feed_data(data[at : at + piece])
                if reached(counter):
                    break
                at += piece
        except HttpParserError:
            pass
        if not reached(counter) or counter.done > completed:
            return None
        if piece == 1:
            return at + 1
        lo = at
        piece //= 8
