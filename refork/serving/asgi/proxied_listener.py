"""The ASGI loop's listeners with the PROXY protocol on: the header read before asyncio takes over.

asyncio and uvloop read a connection as soon as they have it (a TLS one straight into its
handshake), so a header that precedes the request, or the TLS handshake, would be read by them.
A :class:`ProxiedListener` accepts the connections of its listener itself, reads each one's
header off the socket without taking a byte past it (refork.serving.proxied.read_preface), then
hands the socket to the loop (``connect_accepted_socket``, with the listener's TLS) with a
protocol whose client is the one the header names. A connection still sending its header counts
as arriving (Server.adopting: the drain waits for it) and is closed after --header-timeout (a
408 first on a plain listener). A connection refused (a 400 or 403, a 408) closes lingering: its
write side shut after the answer, what the client still sends read and dropped until it closes
or LINGER passes, so that the client reads the answer instead of a reset. None of this is a
request: a health check's connect-and-close or a refusal never ends the worker's drain.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from refork.http.proxy_protocol import INCOMPLETE, ProxyError, ProxyHeader, ProxyPolicy
from refork.http.response import simple_response
from refork.serving.asgi.http_protocol import HttpProtocol
from refork.serving.asgi.roles import Host
from refork.serving.http2 import LINGER
from refork.serving.proxied import CLOSED, peer_host, read_preface, refuse

log = logging.getLogger("refork")

ACCEPT_BATCH = 8  # accepts per wake-up: more would starve sibling workers sharing the listener


class ListenerHost(Host, Protocol):
    """The server as a listener sees it: its connections' host, counting the ones on their way."""

    adopting: int

    def _adopted(self, task: asyncio.Task[Any]) -> None: ...

    def _tls(self, ctx: Any) -> dict[str, Any]: ...


@dataclass
class _Arriving:
    sock: socket.socket
    peer: tuple[str, int] | None
    timer: asyncio.TimerHandle | None = None
    taken: bytes = field(default=b"")


class ProxiedListener:
    """One listener whose connections may start with a PROXY header (see the module docs)."""

    def __init__(self, srv: ListenerHost, sock: socket.socket, ctx: Any, policy: ProxyPolicy) -> None:
        self.srv = srv
        self.sock = sock
        self.ctx = ctx
        self.policy = policy
        self.inet = sock.family in (socket.AF_INET, socket.AF_INET6)
        self.arriving: dict[int, _Arriving] = {}
        self.lingering: dict[int, tuple[socket.socket, asyncio.TimerHandle]] = {}  # refused, closing
        self.open = True
        sock.setblocking(False)
        srv.loop.add_reader(sock.fileno(), self.accept)

    def accept(self, batch: int = ACCEPT_BATCH) -> None:
        loop = self.srv.loop
        for _ in range(batch):
            try:
                conn, addr = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("accept() failed: %s", e)
                return
            conn.setblocking(False)
            if self.inet:
                try:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            fd = conn.fileno()
            arriving = self.arriving[fd] = _Arriving(conn, (addr[0], addr[1]) if self.inet else None)
            arriving.timer = loop.call_later(self.srv.timeouts.header, self._expired, fd)
            self.srv.adopting += 1
            loop.add_reader(fd, self._readable, fd)

    def _readable(self, fd: int) -> None:
        arriving = self.arriving[fd]
        peer = peer_host(arriving.peer)
        try:
            verdict, arriving.taken = read_preface(arriving.sock, arriving.taken, self.policy, peer)
        except (BlockingIOError, InterruptedError):
            return
        except ProxyError as e:
            refuse(arriving.sock, peer, e, self.ctx is not None)
            self._drop(fd, linger=True)
            return
        except OSError:
            self._drop(fd)
            return
        if verdict is INCOMPLETE:
            return
        if verdict is CLOSED:
            self._drop(fd)
            return
        self._forget(fd)
        client = arriving.peer
        if isinstance(verdict, ProxyHeader) and verdict.client is not None:
            client = verdict.client
        srv = self.srv
        adopt = srv.loop.connect_accepted_socket(
            lambda: HttpProtocol(srv, client), arriving.sock, **srv._tls(self.ctx)
        )
        srv.loop.create_task(adopt).add_done_callback(srv._adopted)

    def _expired(self, fd: int) -> None:
        """No verdict within --header-timeout: 408 (on a plain listener) and closed."""
        arriving = self.arriving.get(fd)
        if arriving is not None:
            if self.ctx is None:
                try:
                    arriving.sock.send(simple_response(408))
                except OSError:
                    pass
            self._drop(fd, linger=True)

    def _forget(self, fd: int) -> None:
        arriving = self.arriving.pop(fd)
        self.srv.loop.remove_reader(fd)
        if arriving.timer is not None:
            arriving.timer.cancel()

    def _drop(self, fd: int, linger: bool = False) -> None:
        arriving = self.arriving[fd]
        self._forget(fd)
        if linger:
            self._linger(fd, arriving.sock)
        else:
            arriving.sock.close()
        self.srv.adopting -= 1
        self.srv.check_drained()

    def _linger(self, fd: int, sock: socket.socket) -> None:
        """Close after the answer without a reset: closing a socket with unread input resets the
        connection, and the client may lose the answer it had not read yet."""
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            sock.close()
            return
        self.lingering[fd] = (sock, self.srv.loop.call_later(LINGER, self._lingered, fd))
        self.srv.loop.add_reader(fd, self._discard, fd)

    def _discard(self, fd: int) -> None:
        sock = self.lingering[fd][0]
        try:
            while sock.recv(65536):
                pass
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            pass
        self._lingered(fd)  # the client closed (or reset)

    def _lingered(self, fd: int) -> None:
        lingering = self.lingering.pop(fd, None)
        if lingering is not None:
            self.srv.loop.remove_reader(fd)
            lingering[1].cancel()
            lingering[0].close()

    def close(self) -> None:
        """Accept no more (a graceful stop); the connections sending their header go on."""
        if self.open:
            self.open = False
            self.srv.loop.remove_reader(self.sock.fileno())

    def fds(self) -> list[int]:
        """The sockets still sending their header or lingering (a forked child lets go of them)."""
        return [*self.arriving, *self.lingering]
