"""Chunk framing (RFC 9112 7.1) for the chunk-size lines llhttp refuses and the RFC allows.

llhttp de-chunks request bodies itself, but refuses whitespace (``BWS``) around ``;`` and ``=``
in chunk extensions: ``5 ; name = value``. RFC 9112 7.1.1 allows it::

    chunk      = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
    chunk-ext  = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )

When llhttp fails inside a chunk-size line, refork.http.parser finds where that line began and
hands the rest of the body to :class:`ChunkFraming`, up to and including the last-chunk line;
llhttp then reads the trailer section as usual. Nothing else is lenient: whitespace is allowed
only where BWS is (``5 \\r\\n``, whitespace and no ``;``, stays refused), a line ends in CRLF
(bare LF or CR: 400), a size is hex digits that fit in 64 bits, a name is a token, a value a
token or quoted-string, and the line is bounded as it arrives. Extensions are ignored.
"""

from __future__ import annotations

import re

from refork.http.events import Body, Event, ParseError

_TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_BWS = rb"[ \t]*"
CHUNK_LINE = re.compile(
    rb"([0-9A-Fa-f]+)((?:" + _BWS + rb";" + _BWS + _TOKEN
    + rb"(?:" + _BWS + rb"=" + _BWS + rb"(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?)*)"
)  # fmt: skip
_MAX_SIZE_DIGITS = 16  # 64 bits, as llhttp


class ChunkFraming:
    """Reads chunk-size lines, chunk data and the CRLF after it, from the start of a chunk-size
    line to the end of the last-chunk line. Sans-IO; raises ParseError (400, 413)."""

    __slots__ = ("_line", "_max_line", "_left", "_crlf", "_body_left")

    def __init__(self, max_line: int, body_left: int) -> None:
        self._line = bytearray()  # the chunk-size line received so far
        self._max_line = max_line
        self._left = -1  # chunk data still to come; -1: in a chunk-size line
        self._crlf = b""  # the CRLF after chunk data received so far
        self._body_left = body_left

    def feed(self, data: memoryview, events: list[Event]) -> int | None:
        """Read from data, adding Body events; the offset just past the last-chunk line, or None
        when all of data was read and more is needed."""
        at = 0
        n = len(data)
        while at < n:
            left = self._left
            if left > 0:  # chunk data
                piece = data[at : at + left]
                events.append(Body(bytes(piece)))
                at += len(piece)
                self._left = left - len(piece)
                continue
            if left == 0:  # the CRLF after chunk data
                need = 2 - len(self._crlf)
                got = self._crlf + bytes(data[at : at + need])
                at += len(got) - len(self._crlf)
                if got != b"\r\n"[: len(got)]:
                    raise ParseError(400, "expected CRLF after chunk data")
                self._crlf = got
                if len(got) == 2:
                    self._crlf = b""
                    self._left = -1
                continue
            end = _find_lf(data, at)
            stop = n if end < 0 else end + 1
            self._line += data[at:stop]
            if len(self._line) > self._max_line:
                raise ParseError(400, "chunk-size line too long")
            at = stop
            if end < 0:
                return None
            size = self._size(bytes(self._line))
            self._line = bytearray()
            if size == 0:
                return at
            if size > self._body_left:
                raise ParseError(413, "request body too large")
            self._body_left -= size
            self._left = size
        return None

    @staticmethod
    def _size(line: bytes) -> int:
        if not line.endswith(b"\r\n") or b"\r" in line[:-2]:
            raise ParseError(400, "chunk-size line must end in CRLF")
        m = CHUNK_LINE.fullmatch(line, 0, len(line) - 2)
        if m is None:
            raise ParseError(400, "invalid chunk-size line")
        digits = m.group(1).lstrip(b"0")
        if len(digits) > _MAX_SIZE_DIGITS:
            raise ParseError(400, "chunk size overflow")
        return int(digits or b"0", 16)


def _find_lf(data: memoryview, at: int) -> int:
    """Offset of the next LF in data from at, or -1 (a chunk-size line is short: look ahead a
    bounded amount at a time instead of copying the rest of the read)."""
    n = len(data)
    step = 256
    while at < n:
        piece = bytes(data[at : at + step])
        i = piece.find(b"\n")
        if i >= 0:
            return at + i
        at += len(piece)
        step *= 4
    return -1
