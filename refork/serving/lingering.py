"""The WSGI loop's lingering close (RFC 9112 9.6): a connection it is done with is shut for
writing and stays in the poller, its reads dropped, until the client's FIN or LINGER passes.

Closing a socket with input unread (a pipelined request, a request behind a refused PROXY header,
bytes the client writes a moment after the answer) sends a reset, which can destroy the answer
still unread in the client's buffer and shows a client that reuses the connection ECONNRESET
rather than EOF. A lingering socket holds no request state, only its fd, for at most LINGER
(refork.serving.http2, the ASGI loop's bound too) and LINGER_DROP bytes.
"""

from __future__ import annotations

import socket

from refork.serving.http2 import LINGER
from refork.serving.poller import Poller

LINGER_DROP = 1 << 18  # bytes a lingering connection reads and drops at most

__all__ = ["LINGER_DROP", "Lingering"]


class Lingering:
    """The sockets a loop closes lingering, by fd: each polled for reads until it ends."""

    __slots__ = ("poller", "socks")

    def __init__(self, poller: Poller) -> None:
        self.poller = poller
        self.socks: dict[int, tuple[socket.socket, float, int]] = {}  # fd -> (socket, since, dropped)

    def __contains__(self, fd: int) -> bool:
        return fd in self.socks

    def __len__(self) -> int:
        return len(self.socks)

    def fds(self) -> list[int]:
        return list(self.socks)

    def close(self, sock: socket.socket, now: float) -> None:
        """Shut the write side (a FIN after what is written), drop what already waits, and keep
        the socket polled if the client has not closed yet. `sock` may be a TLS one whose
        close_notify went out: its plain socket is read from here."""
        try:
            socket.socket.shutdown(sock, socket.SHUT_WR)
        except OSError:  # the client is gone
            sock.close()
            return
        fd = sock.fileno()
        self.socks[fd] = (sock, now, 0)
        self.poller.register(fd)
        self.on_readable(fd)

    def on_readable(self, fd: int) -> None:
        """Read and drop what the client sent; its FIN, an error or too many bytes end it."""
        sock, since, dropped = self.socks[fd]
        try:
            while dropped < LINGER_DROP:
                data = socket.socket.recv(sock, 1 << 16, socket.MSG_DONTWAIT)
                if not data:
                    break
                dropped += len(data)
            else:
                self._end(fd)
                return
        except (BlockingIOError, InterruptedError):
            self.socks[fd] = (sock, since, dropped)
            return
        except OSError:
            pass
        self._end(fd)

    def sweep(self, now: float) -> None:
        """Close the sockets that lingered LINGER."""
        for fd in [fd for fd, (_, since, _) in self.socks.items() if now - since >= LINGER]:
            self._end(fd)

    def end_all(self) -> None:
        """Close every lingering socket (the loop shuts down: no unregister, as the loop's own
        shutdown, since a forked child shares the epoll)."""
        for sock, _, _ in self.socks.values():
            sock.close()
        self.socks.clear()

    def forget(self) -> None:
        """In a forked child: the sockets are the parent's (refork.serving.connection.release_after_fork)."""
        self.socks.clear()

    def _end(self, fd: int) -> None:
        sock = self.socks.pop(fd)[0]
        self.poller.unregister(fd)
        try:
            sock.close()
        except OSError:
            pass
