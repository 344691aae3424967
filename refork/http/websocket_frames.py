"""The common WebSocket frame, read without wsproto: a fast path in front of it (RFC 6455 5.2).

Nearly every frame a client sends is one whole text or binary message: FIN set, no RSV bits,
masked, a few bytes to a few KiB. wsproto reads it through a generator chain and a pure-Python
unmasker (about 12 µs a frame here, most of an echo's cost). :class:`FrameSplitter` reads that
frame itself (unmasking with one big-integer XOR) and passes every other *complete* frame on,
whole and in order, for wsproto: control frames, fragments and what follows them until the final
continuation, RSV bits, non-minimal lengths, invalid UTF-8, frames over the size limit, anything
wrong. So wsproto only ever receives whole frames, stays at a frame boundary, and keeps judging
every rule of the protocol (1002, 1007, 1009 are its verdicts, or the caller's, as before). A
frame that is incomplete and big (past :data:`BIG`) is not buffered here: the splitter hands
everything from there on to wsproto and switches itself off for the connection.

Only for connections without an extension (permessage-deflate frames are wsproto's).
"""

from __future__ import annotations

BIG = 1 << 16  # an incomplete frame longer than this goes to wsproto (no re-buffering here)


class ForWsproto(bytes):
    """Bytes for wsproto: one or more whole frames, or (once the splitter is off) the rest."""

    __slots__ = ()


class FrameSplitter:
    """Bytes from a client in; whole messages (``str`` or ``bytes``) and :class:`ForWsproto`
    pieces out, in stream order. ``enabled`` turns False for good when it gives up."""

    __slots__ = ("pending", "in_fragment", "max_size", "enabled")

    def __init__(self, max_size: int) -> None:
        self.pending = b""  # an incomplete frame (at most BIG bytes) from the last read
        self.in_fragment = False  # wsproto is inside a fragmented message: its frames go there
        self.max_size = max_size
        self.enabled = True

    def feed(self, data: bytes) -> list[str | bytes]:
        buf = self.pending + data if self.pending else data
        self.pending = b""
        out: list[str | bytes] = []
        n = len(buf)
        pos = 0
        while n - pos >= 2:
            b0 = buf[pos]
            b1 = buf[pos + 1]
            length = b1 & 0x7F
            head = 2
            if length == 126:
                if n - pos < 4:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 4], "big")
                head = 4
                minimal = length >= 126
            elif length == 127:
                if n - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                head = 10
                minimal = length >= 1 << 16
                if length >> 63:  # the most significant bit must be 0: wsproto refuses it
                    return self._give_up(out, buf[pos:])
            else:
                minimal = True
            if b1 & 0x80:
                head += 4
            end = pos + head + length
            if end > n:
                if end - pos > BIG:
                    return self._give_up(out, buf[pos:])
                break
            fast = (b0 == 0x81 or b0 == 0x82) and b1 & 0x80 and minimal and not self.in_fragment
            if fast and length <= self.max_size:
                payload = _unmask(buf[pos + head - 4 : pos + head], buf[pos + head : end])
                if b0 == 0x82:
                    out.append(payload)
                    pos = end
                    continue
                try:
                    out.append(payload.decode("utf-8"))
                    pos = end
                    continue
                except UnicodeDecodeError:
                    pass  # wsproto closes with 1007
            opcode = b0 & 0x0F
            if opcode == 1 or opcode == 2:
                self.in_fragment = not b0 & 0x80
            elif opcode == 0 and b0 & 0x80:
                self.in_fragment = False
            frame = ForWsproto(buf[pos:end])
            if out and type(out[-1]) is ForWsproto:  # consecutive frames for wsproto: one piece
                out[-1] = ForWsproto(out[-1] + frame)
            else:
                out.append(frame)
            pos = end
        self.pending = bytes(buf[pos:])
        return out

    def _give_up(self, out: list[str | bytes], rest: bytes) -> list[str | bytes]:
        self.enabled = False
        out.append(ForWsproto(rest))
        return out


def _unmask(mask: bytes, payload: bytes) -> bytes:
    n = len(payload)
    if not n:
        return b""
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "little")
    return (int.from_bytes(payload, "little") ^ key).to_bytes(n, "little")


def server_frame(data: str | bytes) -> bytes:
    """One whole unmasked server message frame (RFC 6455 5.2), as wsproto would build it."""
    if isinstance(data, str):
        payload = data.encode("utf-8")
        first = 0x81
    else:
        payload = bytes(data)
        first = 0x82
    n = len(payload)
    if n < 126:
        return bytes((first, n)) + payload
    if n < 1 << 16:
        return bytes((first, 126)) + n.to_bytes(2, "big") + payload
    return bytes((first, 127)) + n.to_bytes(8, "big") + payload
