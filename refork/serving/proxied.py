"""The PROXY protocol header read off a connection's socket by the Python loops, before anything else.

A step of :func:`read_preface` peeks at what the socket holds and takes exactly the header's bytes
(refork.http.proxy_protocol: while the verdict is INCOMPLETE every byte so far is the header's):
what follows, a request or a TLS handshake, stays in the socket for the loop's usual reads. So
one routine serves plain and TLS listeners, the WSGI loop (from its epoll loop) and the ASGI loop
(from a reader callback, before asyncio or uvloop take the socket). The native engines read the
header in Rust (native/src/proxy.rs) from the bytes they read anyway.
"""

from __future__ import annotations

import logging
import socket

from refork.http.proxy_protocol import INCOMPLETE, NOT_PROXY, PEEK, ProxyError, ProxyHeader, ProxyPolicy
from refork.http.response import simple_response

log = logging.getLogger("refork")

CLOSED = "closed"  # the peer closed (or reset) before a verdict


def read_preface(sock: socket.socket, taken: bytes, policy: ProxyPolicy, peer: str | None
                 ) -> tuple[ProxyHeader | object, bytes]:  # fmt: skip
    """One non-blocking step: (verdict, the header's bytes taken so far, `taken` included).

    The verdict is INCOMPLETE (call again when the socket is readable), NOT_PROXY, CLOSED or a
    ProxyHeader; ProxyError (its `status`) for a malformed or forbidden header. BlockingIOError
    when nothing arrived. `sock` may be an ssl.SSLSocket whose handshake has not started: its
    plain socket is read.
    """
    try:
        raw = socket.socket.recv(sock, PEEK, socket.MSG_PEEK)
    except (ConnectionError, TimeoutError):
        return CLOSED, taken
    if not raw:
        return CLOSED, taken
    data = taken + raw
    verdict = policy.check(data, peer)
    if verdict is INCOMPLETE:
        take = len(raw)
    elif verdict is NOT_PROXY:
        take = 0
    else:
        assert isinstance(verdict, ProxyHeader)
        take = verdict.length - len(taken)
    if take:
        socket.socket.recv(sock, take)  # peeked: all of it is there
    return verdict, data[: len(taken) + take]


def refuse(sock: socket.socket, peer: str | None, error: ProxyError, tls: bool) -> None:
    """A malformed (400) or forbidden (403) header: gunicorn's answer (none before a TLS handshake:
    the client speaks TLS), one warning line; the caller closes the socket."""
    log.warning("PROXY protocol: %s (from %s); connection closed", error, peer or "a unix-socket peer")
    if not tls:
        try:
            socket.socket.send(sock, simple_response(error.status))
        except OSError:
            pass


def peer_host(client: object) -> str | None:
    """The peer's address of a loop's client tuple (None: a unix-socket peer)."""
    return str(client[0]) if isinstance(client, tuple) else None


__all__ = ["CLOSED", "peer_host", "read_preface", "refuse"]
