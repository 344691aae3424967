"""A file's bytes onto an ASGI connection: ``os.sendfile`` on plain sockets, read+write over TLS.

What :meth:`refork.serving.asgi.http_protocol.HttpProtocol.send_file` does for the
``http.response.pathsend`` and ``http.response.zerocopysend`` extensions.

Neither asyncio's transports nor uvloop's let anyone else register the socket for writability
(and uvloop has no ``loop.sendfile``), so the kernel copy runs beside the transport: while the
transport's own buffer is empty, ``os.sendfile`` goes straight to the (non-blocking) socket until
the kernel's buffer is full; then one small piece is read and handed to the transport, whose
write-buffer limits are 0 for the duration, so ``resume_writing`` comes exactly when its buffer
is empty again and the socket has room. Bytes never overtake one another: the socket is written
directly only when nothing is queued in front. Over TLS the kernel cannot encrypt: the file is
read in pieces and written through the transport with its ordinary flow control.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from refork.asgi import ClientDisconnected


class Sending(Protocol):
    """The connection a file goes out on (an HttpProtocol): its transport and its write pause."""

    transport: Any  # the asyncio transport (uvloop's or the stdlib's)
    closing: bool
    write_blocked_since: float

    async def wait_writable(self) -> None: ...


NUDGE = 16 * 1024  # read+write when the kernel is full: it wakes us when the socket drained
TLS_PIECE = 256 * 1024  # read+write pieces over TLS


async def send_file(conn: Sending, fd: int, offset: int, count: int) -> int:
    """Write `count` bytes of `fd` from `offset` to the connection; the number sent (fewer: EOF)."""
    transport = conn.transport
    sock = transport.get_extra_info("socket")
    plain = sock is not None and transport.get_extra_info("ssl_object") is None
    if not plain:
        return await _copy(conn, fd, offset, count, TLS_PIECE)
    out = sock.fileno()
    low, high = transport.get_write_buffer_limits()
    transport.set_write_buffer_limits(high=0, low=0)
    sent = 0
    try:
        while sent < count:
            if conn.closing:
                raise ClientDisconnected("client disconnected")
            if not transport.get_write_buffer_size():
                try:
                    n = os.sendfile(out, fd, offset + sent, count - sent)
                except (BlockingIOError, InterruptedError):
                    n = -1
                except OSError as exc:  # EPIPE, ECONNRESET: the client is gone
                    transport.abort()
                    raise ClientDisconnected(f"client disconnected: {exc}") from None
                if n == 0:
                    return sent  # the file is shorter than announced
                if n > 0:
                    sent += n
                    continue
            piece = os.pread(fd, min(NUDGE, count - sent), offset + sent)
            if not piece:
                return sent
            transport.write(piece)
            sent += len(piece)
            if conn.write_blocked_since:
                await conn.wait_writable()
    finally:
        if not transport.is_closing():
            transport.set_write_buffer_limits(high=high, low=low)
    return sent


async def _copy(conn: Sending, fd: int, offset: int, count: int, piece_size: int) -> int:
    sent = 0
    while sent < count:
        if conn.closing:
            raise ClientDisconnected("client disconnected")
        piece = os.pread(fd, min(piece_size, count - sent), offset + sent)
        if not piece:
            break
        conn.transport.write(piece)
        sent += len(piece)
        if conn.write_blocked_since:
            await conn.wait_writable()
    return sent
