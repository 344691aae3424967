"""Client sockets as tests end them."""

from __future__ import annotations

import socket


def hang_up(sock: socket.socket) -> None:
    """Close a client whose reader thread may still be in recv(): close() alone would not end the
    connection while that recv() holds the socket (no FIN until data arrived)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # the server closed it already
    sock.close()
