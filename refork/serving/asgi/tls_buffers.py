"""What a TLS connection of the ASGI loop holds outside --max-request-memory, bounded.

The event loop's SSL layer keeps buffers of its own per connection, sized for one fast client, not
for the hundreds a flood opens: the bytes read from the socket and not decrypted yet (up to
256 KiB each, filled while the protocol has reading paused for a full budget or a slow app), and
on asyncio 3.11+ a 256 KiB read buffer allocated and zeroed for every connection, idle or not.
Measured on uvloop before these bounds: 300 TLS connections flooding header blocks took a worker
117 MB over its baseline, where its budget was 16 MiB.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from refork.serving.http2 import LINGER

__all__ = ["PIECE", "close_refused", "feed_tls", "hold_tls_reads", "size_asyncio_tls_reads"]

RECORD = 16 * 1024  # the most plaintext one TLS record carries
PIECE = 4 * RECORD  # the most a response write hands the SSL layer at once (feed_tls)


def size_asyncio_tls_reads(read_size: int) -> None:
    """asyncio's SSL protocol (3.11+) gives each connection a read buffer of its class's
    ``max_size``: the worker's read size instead (what its plain connections read at once)."""
    if sys.version_info >= (3, 11):
        from asyncio import sslproto

        sslproto.SSLProtocol.max_size = read_size


def hold_tls_reads(transport: Any) -> None:
    """While the protocol is not reading, the SSL layer stops reading the socket once a record
    waits undecrypted (its high-water mark; 256 KiB by default). asyncio before 3.11 has no such
    buffer to bound (nor the method)."""
    limits = getattr(transport, "set_read_buffer_limits", None)
    if limits is not None:
        limits(high=RECORD)


def close_refused(transport: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Close a connection whose client refork refused (a malformed or over-limit request, an HTTP/2
    connection error), its answer written. Over TLS: no close_notify exchange, during which uvloop's
    SSL layer would keep all the client still sends (and a refused client is the one that floods).
    The connection reads on and its protocol drops what comes, so the client has LINGER to read its
    answer; then it is cut (with nothing left unread, a plain FIN)."""
    if transport.get_extra_info("ssl_object") is None:
        transport.close()
        return
    loop.call_later(LINGER, transport.abort)


def feed_tls(conn: Any) -> bool:
    """Hand the SSL layer `conn.unsent` (views of a response's bytes) a PIECE at a time until it
    pauses writing; True: all of it went and writing is not paused.

    The SSL layer encrypts what one write gives it at once and hands it to the socket's transport
    whenever that is not paused, where neither write flow control nor close() sees it any more:
    the close_notify exchange (bounded: Server._tls) drops what is still there when it ends. Fed in
    pieces, what waits stays here or in the SSL layer's own buffer, whose size close() can wait on.
    """
    unsent, write = conn.unsent, conn.transport.write
    while unsent and not conn.write_blocked_since:
        view = unsent[0]
        if len(view) > PIECE:
            unsent[0] = view[PIECE:]
            view = view[:PIECE]
        else:
            del unsent[0]
        write(view)
    return not unsent and not conn.write_blocked_since
