"""What a request parser holds while a message arrives over several reads, and its bounds.

- The head (or trailer section) in progress is measured as it arrives (``head_held``, for a
  loop's per-worker budget), and a line past its limit is refused as soon as that many bytes came
  without its end (414 for the request line, 431 for a field line), not when it ends: llhttp
  would hold the line in memory until then. The reason of such a refusal says ARRIVING.
- What llhttp was fed since the last read that ended between messages is kept (up to MAX_HELD),
  so a later read that completes a head split across reads can be replayed from a boundary to
  find a pipelined unknown method (refork.http.rare).

:class:`ArrivingBytes` is a base of refork.http.parser.RequestParser, whose state it uses
(declared in refork.http.rare.RareRequests' slots, typed here for the type checker only).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from refork.http.events import Body, Event, ParseError, Request
from refork.http.llhttp import may_name_other_protocol
from refork.http.rare import EOM

ARRIVING = "still arriving"
MAX_HELD = 1 << 16  # bytes kept across reads for a replay (see ArrivingBytes._hold)


class ArrivingBytes:
    """RequestParser's bookkeeping of a message arriving over several reads (see the module docstring)."""

    if not TYPE_CHECKING:  # (the type checker would refuse the state it assigns, slotted elsewhere)
        __slots__ = ()

    _events: list[Event]
    _max_line: int
    _max_field: int
    _request: Request | None
    _head_started: bool
    _chunk_line: bool
    head_held: int
    _line: int
    _past_first: bool
    _ended_in_body: bool
    _held: bytearray | None
    _held_done: int
    _refed: tuple[bytes, memoryview, int] | None
    _carry: int

    if TYPE_CHECKING:  # RareRequests'

        def _fail(self, status: int, reason: str) -> ParseError: ...

    def _measure(self, data: bytes | bytearray | memoryview, began_inside: bool) -> None:
        """A read ended inside a request head or a trailer section: how much of it the parser
        holds now (head_held) and how long its line still arriving is; a line past its limit is
        refused now (see the module docstring), not when it ends.

        The bytes of a head that began in an earlier read are all its own. A head that began in
        this read is measured from the read's start when nothing came before it in the read; after
        other messages in the same read (pipelining) where it began is not known, so only what
        follows the last LF (less a body's LF-free tail before it) is counted, and the check waits
        for the next read. A trailer section begins right after an LF (the last-chunk line)."""
        if type(data) is memoryview:
            data = bytes(data)
        n = len(data)
        nl = data.rfind(b"\n")
        request_head = self._request is None
        if not self._head_started:  # began in an earlier read: all of this read is the head's
            line = n - nl - 1 if nl >= 0 else self._line + n
            held = self.head_held + n
            if nl >= 0:
                self._past_first = True
        elif not request_head:  # a trailer section
            line = held = n - nl - 1
        elif not began_inside and not any(e is EOM for e in self._events):  # from the read's start
            start = n - len(data.lstrip(b"\r\n"))  # (after empty lines, RFC 9112 2.2)
            held = n - start
            self._past_first = nl >= start
            line = n - nl - 1 if self._past_first else held
        else:  # after other messages in this read
            line = held = max(0, n - nl - 1 - self._tail_before(nl))
            self._past_first = True  # (the next read checks, from an undercount: see above)
            self.head_held, self._line = held, line
            return
        self.head_held, self._line = held, line
        if request_head and not self._past_first:
            if line > self._max_line + 1:  # (and its CR)
                raise self._fail(414, f"request line too long ({ARRIVING})")
        elif line > self._max_field + 4:  # name and value, ": " and CR
            field = "header" if request_head else "trailer"
            raise self._fail(431, f"{field} field too large ({ARRIVING})")

    def _tail_before(self, nl: int) -> int:
        """The LF-free bytes a Content-Length body put before this read's last LF-free run (the
        head after it began there), from this read's Body events of the message that ended last."""
        if not self._ended_in_body:
            return 0
        events = self._events
        i = len(events) - 1
        while i >= 0 and events[i] is not EOM:
            i -= 1
        tail = 0
        i -= 1
        while i >= 0 and type(events[i]) is Body:
            piece = events[i].data  # type: ignore[union-attr]
            at = piece.rfind(b"\n")
            if at >= 0:
                return tail + len(piece) - at - 1
            tail += len(piece)
            i -= 1
        return tail

    def _between_requests(self) -> None:
        """A read ended between two requests: nothing held, nothing re-fed to remember."""
        self._held, self._held_done, self._refed = bytearray(), 0, None

    def _hold(self, data: bytes | memoryview) -> None:
        """A read ended inside a message: keep what llhttp was fed since the last boundary
        between reads (bounded: a replay is worth it for a head split across reads, not for a
        streamed body), for a later read that completes it and holds an unknown method."""
        if self._request is None and not self._carry and may_name_other_protocol(data, partial=True):
            self._carry = 2  # the head in progress may name another protocol (see _check_protocol)
        refed = self._refed
        held = self._held
        if refed is not None:  # a fresh llhttp began in this read with the placeholder
            self._refed = None
            first, view, at = refed
            held = bytearray(first)
            held += view
            self._held_done = sum(1 for e in self._events[at:] if e is EOM)
        elif held is None:
            return
        else:
            held += data
            self._held_done += sum(1 for e in self._events if e is EOM)
        self._held = held if len(held) <= MAX_HELD else None

    def _overflow(self) -> ParseError:
        if self._request is None:
            return self._fail(431, "request header fields too large")
        if self._chunk_line:
            return self._fail(400, "chunk-size line too long")
        return self._fail(431, "trailer section too large")
