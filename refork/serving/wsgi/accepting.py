"""Where the Python loop's connections begin: its listeners, the accept, and when it holds off.

A TLS listener's connections are wrapped for the loop's own non-blocking handshake. Accepting
stops for a second when accept() fails for want of fds or memory, and while no app thread of
``--threads`` > 1 is free but another worker has one (the loop decides; :meth:`Acceptor.hold`).
The accepted connections go to the loop, which registers them (:mod:`refork.serving.wsgi.python_loop`).
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from refork.serving.contract import WorkerControl
from refork.serving.outbox import Outbox
from refork.serving.poller import Poller
from refork.serving.settings import ServingSettings
from refork.serving.tls_io import TlsConn, TlsOutbox, log_failure, wrap
from refork.serving.wsgi.conn import Conn
from refork.wsgi import EnvironBuilder

log = logging.getLogger("refork")

Listeners = dict[int, tuple[socket.socket, EnvironBuilder]]  # by fd: the socket, its environ builder


def listening(listeners: list[socket.socket], settings: ServingSettings,
              builder: Callable[[EnvironBuilder], EnvironBuilder]) -> Listeners:  # fmt: skip
    """Each listener non-blocking, with the environ builder of its address (as `builder` makes it:
    pure Python, or refork._native's)."""
    made: Listeners = {}
    for lsock in listeners:
        lsock.setblocking(False)
        try:
            addr = lsock.getsockname()
        except OSError:
            addr = ""
        server = (str(addr[0]), int(addr[1])) if isinstance(addr, tuple) else str(addr)
        base = EnvironBuilder(
            server=server,
            root_path=settings.root_path,
            multithread=settings.threads > 1,
            proxies=settings.forwarded,
            url_scheme="https" if lsock.fileno() in settings.tls else "http",
        )
        made[lsock.fileno()] = (lsock, builder(base))
    return made


class Acceptor:
    """The loop's listeners: accepting on them, and taking them out of the poller and back."""

    def __init__(self, listeners: Listeners, poller: Poller, control: WorkerControl,
                 settings: ServingSettings, conn_type: type[Conn], alpn: list[str]) -> None:  # fmt: skip
        self.listeners = listeners
        self.poller = poller
        self.control = control
        self.settings = settings
        self.conn_type = conn_type  # Conn, or the native parser's (refork.serving.wsgi.native_parts.NATIVE)
        self.tls = settings.tls  # listener fd -> SSLContext (TLS listeners)
        self.buffering = settings.threads <= 1  # an app thread's writes block instead (refork.serving.outbox)
        self.paused_until = 0.0  # accept() failed: out of the poller until then
        self.held = False  # no app thread is free: out of the poller (hold)
        for context in set(self.tls.values()):  # (this process's copy of the context)
            context.set_alpn_protocols(alpn)

    def register(self) -> None:
        for fd in self.listeners:
            self.poller.register(fd)

    def unregister(self) -> None:
        for fd in self.listeners:
            self.poller.unregister(fd)

    def hold(self, full: bool) -> None:
        """Hold off accepting while `full` (see PythonLoop._hold_accepts), accept again after."""
        if full == self.held:
            return
        self.held = full
        if self.paused_until:
            return  # out of the poller already; resume looks at held
        if full:
            self.unregister()
        else:
            self.register()

    def resume(self, now: float, draining: bool) -> None:
        """The second after a failed accept() is over: back in the poller (unless held)."""
        if self.paused_until and now >= self.paused_until:
            self.paused_until = 0.0
            if not draining and not self.held:
                self.register()

    def accept(self, entry: tuple[socket.socket, EnvironBuilder], batch: int) -> list[Conn]:
        """Up to `batch` new connections on this listener, for the loop to register."""
        lsock, builder = entry
        inet = lsock.family in (socket.AF_INET, socket.AF_INET6)
        now = time.monotonic()
        accepted: list[Conn] = []
        settings = self.settings
        for _ in range(batch):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return accepted
            except OSError as e:
                if e.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                # out of fds or memory (or worse): back off instead of spinning on a ready listener
                log.error("accept() failed: %s; pausing accepts for a second", e)
                self.unregister()
                self.paused_until = now + 1.0
                return accepted
            sock.setblocking(False)
            if inet:
                try:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                except OSError:
                    pass
            client = (addr[0], addr[1]) if inet else None
            ctx = self.tls.get(lsock.fileno()) if self.tls else None
            if ctx is not None:
                conn = self._tls_conn(ctx, sock, client, builder)
                if conn is None:
                    continue
            else:
                conn = self.plain(sock, client, builder)
            conn.since = now
            if settings.proxy is not None:
                conn.preface = b""  # a PROXY header may come first (see RequestPath._read_preface)
            if settings.h2c and ctx is None:
                conn.sniffed = b""  # the HTTP/2 preface may come first (refork.serving.wsgi.http2.sniff)
            accepted.append(conn)
        return accepted

    def plain(self, sock: socket.socket, client: Any, builder: EnvironBuilder) -> Conn:
        """A connection of a plain socket (accepted here, or handed over by an engine)."""
        out = Outbox(sock, client, self.settings.timeouts.write, self.control, buffering=self.buffering)
        return self.conn_type(sock, client, builder, self.settings.limits, out)

    def _tls_conn(self, ctx: ssl.SSLContext, sock: socket.socket, client: Any, builder: EnvironBuilder
                  ) -> Conn | None:  # fmt: skip
        """A connection on a TLS listener: wrapped, its handshake left to the request path's reads."""
        try:
            tsock = wrap(ctx, sock)
        except OSError as e:  # the client is already gone
            log_failure(client, e, True)
            sock.close()
            return None
        settings = self.settings
        out = TlsOutbox(tsock, client, settings.timeouts.write, self.control, buffering=self.buffering)
        return self.conn_type(tsock, client, builder, settings.limits, out, TlsConn(tsock))
