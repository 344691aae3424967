"""TLS connection I/O of the WSGI Python loop: the non-blocking handshake, reads and writes.

The loop (:mod:`refork.serving.wsgi.python_loop`) wraps an accepted socket in a non-blocking
``SSLSocket`` (:func:`wrap`, with the context of :mod:`refork.serving.tls_context`) and drives the
handshake from its epoll loop (:class:`TlsConn`), never from an app thread; :class:`TlsOutbox`
writes responses through it (``SSLWantWrite`` and ``SSLWantRead`` on a write included) and has no
``sendfile()`` (the body is read and encrypted instead).
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
from typing import Any

from refork.serving.outbox import Outbox

log = logging.getLogger("refork")

IN, OUT = select.POLLIN, select.POLLOUT
_CHUNK = 1 << 18  # bytes per SSL_write: a retry after SSLWantWrite repeats exactly this slice
_RECORD = 1 << 14  # the largest TLS record's plaintext
_READ_ROUNDS = 4  # records per read call (16 KiB each) before the loop turns to other connections


def log_failure(client: Any, exc: BaseException, handshake: bool) -> None:
    """A client that failed TLS (garbage, plain HTTP, closed mid-handshake): a debug line, no trace."""
    what = "TLS handshake" if handshake else "TLS connection"
    log.debug("%s with %s failed: %s", what, client[0] if client else "unix", exc)


class TlsConn:
    """The TLS side of one WSGI connection: handshake first, then reads, from the I/O loop only.

    ``wants`` is what the socket must be polled for to go on (IN, or OUT when OpenSSL must write
    to read); the loop re-arms epoll when it changes.
    """

    __slots__ = ("sock", "handshaking", "wants", "polled")

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self.handshaking = True
        self.wants = IN
        self.polled = IN

    def read(self, size: int) -> bytes | None:
        """Decrypted bytes; b"" when the client closed; None when nothing is ready yet (see
        ``wants``). OSError (SSLError included) when the connection failed."""
        sock = self.sock
        try:
            if self.handshaking:
                sock.do_handshake()
                self.handshaking = False
            data = sock.recv(size)
        except ssl.SSLWantReadError:
            self.wants = IN
            return None
        except ssl.SSLWantWriteError:
            self.wants = OUT
            return None
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            return b""
        except (BlockingIOError, InterruptedError):
            self.wants = IN
            return None
        self.wants = IN
        if not data:
            return data
        chunks = [data]
        total = len(data)
        # one recv is one TLS record: after a full one (an upload) take a few more that are here;
        # a short one was the end of what the client sent (epoll says when there is more)
        for _ in range(_READ_ROUNDS if total >= _RECORD else 0):
            if total >= size:
                break
            try:
                more = sock.recv(size - total)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                break
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break  # the next read sees it again
            if not more:
                break
            chunks.append(more)
            total += len(more)
        # what OpenSSL already decrypted must be taken now: epoll cannot tell that it is there
        while True:
            pending = sock.pending()
            if not pending:
                break
            try:
                chunks.append(sock.recv(pending))
            except OSError:
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close_notify(self) -> None:
        """Say goodbye in TLS before the socket closes (strict clients, OpenSSL 3's among them, call an
        EOF without it an error); never waits for the client's."""
        if self.handshaking:
            return
        try:
            self.sock.unwrap()
        except (OSError, ValueError):
            pass  # SSLWantRead (the client's close_notify is not awaited) or the client is gone

    def has_input(self) -> bool:
        """Decrypted bytes wait in OpenSSL, or raw bytes (or a FIN) in the kernel."""
        if self.sock.pending():
            return True
        try:  # the plain socket's recv: SSLSocket refuses flags
            return bool(socket.socket.recv(self.sock, 1, socket.MSG_PEEK))
        except OSError:
            return False


class TlsOutbox(Outbox):
    """An :class:`Outbox` over an SSLSocket: no sendfile (``zero_copy`` False: the body is read and
    written), and a write blocked on either direction of the socket (``wants``)."""

    __slots__ = ()

    zero_copy = False

    def send(self, data: bytes) -> None:
        queue = self.queue
        queue.append(memoryview(data))
        self.backlogged = True
        if not self.buffering:
            self.flush()
        elif len(queue) == 1:
            self.write_some()

    def hint(self, data: bytes) -> None:
        # a TLS record is all or nothing, and one OpenSSL could not write now must be offered again
        # as it was: a hint not written at once stays queued, ahead of the response
        if self.queue:
            return
        self.queue.append(memoryview(data))
        self.backlogged = True
        self.write_some()

    def sendfile(self, fd: int, offset: int, count: int | None) -> int:  # pragma: no cover - zero_copy
        raise OSError("sendfile() over TLS")

    def write_some(self) -> bool:
        queue = self.queue
        sock = self.sock
        while queue:
            item = queue[0]
            if isinstance(item, tuple):  # pragma: no cover - never queued (zero_copy is False)
                raise OSError("sendfile() over TLS")
            # SSL_write without partial writes: all of the slice or an error; a retry after
            # SSLWantWrite/Read must repeat the same slice, which it does (the item is unchanged)
            chunk = item[:_CHUNK] if len(item) > _CHUNK else item
            try:
                sock.send(chunk)
            except ssl.SSLWantWriteError:
                self.wants = OUT
                return False
            except ssl.SSLWantReadError:
                self.wants = IN
                return False
            except (BlockingIOError, InterruptedError):
                self.wants = OUT
                return False
            if len(chunk) < len(item):
                queue[0] = item[len(chunk):]
            else:
                queue.popleft()
        self.wants = OUT
        self.backlogged = False
        return True


def wrap(ctx: ssl.SSLContext, sock: socket.socket) -> ssl.SSLSocket:
    """An accepted (non-blocking) socket as a server-side SSLSocket; the handshake is left to the loop."""
    return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
