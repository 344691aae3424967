"""ASGI connection loop on asyncio or uvloop: one Protocol per connection, one Task per request.

This module is the worker's side: :class:`Server` (listening, the once-a-second sweep, the
graceful stop and its backlog, lifespan), :func:`serve_asgi` (safe points between two
run_forever() calls) and the clean-up of a forked child. Each connection is an
:class:`refork.serving.asgi.http_protocol.HttpProtocol`: it feeds bytes to the sans-IO
:class:`RequestParser` and hands each complete request head to a :class:`refork.asgi.HttpCycle`,
which runs the app; the protocol drives the cycle and the cycle answers through its
:class:`refork.asgi.Channel` only. The deadlines of
:mod:`refork.serving.connection` (header, body, write, keep-alive, the drain) are swept once a
second instead of arming a timer per request; the body and write deadlines hold while the app
runs. A request whose app awaits its client (receive() for body bytes, send() over the
transport's high-water mark) does not hold the worker's --timeout (WorkerControl.request_waiting).
No thread is ever started here: the process may fork at a safe point.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import sys
import weakref
from collections.abc import Callable
from typing import Any

from refork.asgi import HttpCycle, Lifespan
from refork.config import Config
from refork.http.budget import MemoryBudget
from refork.memory.allocator import FloodTrim
from refork.serving.asgi.http_protocol import HttpProtocol
from refork.serving.asgi.proxied_listener import ProxiedListener
from refork.serving.asgi.roles import Connection
from refork.serving.asgi.tls_buffers import size_asyncio_tls_reads
from refork.serving.asgi.websocket_protocol import WebSocketProtocol
from refork.serving.connection import TICK, accepted_fds, release_after_fork
from refork.serving.contract import WorkerControl
from refork.serving.http2 import LINGER, alpn_protocols, http2_limits
from refork.serving.settings import ServingSettings

log = logging.getLogger("refork")

FLOOD = 16  # connections at once past which their going is worth a malloc_trim()

_ABANDONED: list[Any] = []  # what a forked child must never finalize (see _abandon_after_fork)


def new_event_loop(config: Config) -> asyncio.AbstractEventLoop:
    """uvloop when wanted and importable, else the stdlib loop."""
    if config.loop in ("auto", "uvloop"):
        try:
            import uvloop
        except ImportError:
            if config.loop == "uvloop":
                raise RuntimeError("loop = 'uvloop' but uvloop is not installed") from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class Server:
    """Per-worker state shared by all connections: app, config, control, counters."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        listeners: list[socket.socket],
        app: Any,
        config: Config,
        control: WorkerControl,
        settings: ServingSettings,
    ) -> None:
        self.loop = loop
        self.listeners = listeners
        self.app = app
        self.config = config
        self.control = control
        self.settings = settings
        self.limits = settings.limits
        self.proxies = settings.forwarded if settings.forwarded_allowed else None
        self.root_path = settings.root_path
        self.lifespan = Lifespan(app)
        self.access_log = settings.access_log
        self.request_hooks = settings.request_hooks  # pre_request / post_request, if any
        self.health = settings.health
        self.timeouts = settings.timeouts
        self.read_size = settings.read_size  # what one read of a connection may take (see HttpProtocol)
        if settings.tls:
            size_asyncio_tls_reads(settings.read_size)  # (and each TLS transport: hold_tls_reads)
        self.connections: set[Connection] = set()  # HttpProtocol, WebSocketProtocol, Http2Protocol
        self.h2_limits = http2_limits(config)  # HTTP/2 (refork.serving.asgi.http2_protocol): h2 by ALPN, h2c
        self.h2_alpn = "h2" in config.http_protocols
        self.h2c = "h2c" in config.http_protocols
        self.h1 = "h1" in config.http_protocols
        # plain connections accepted, their protocol made, connection_made not called yet (the
        # loop iteration in between): weak, so that one whose socket failed cannot hold the drain
        self.arriving: weakref.WeakSet[Connection] = weakref.WeakSet()
        # TLS connections accepted, their handshake under way (connection_made not called yet; a
        # failed one never calls back, so weak too): they hold a drain as long as its grace lasts
        self.handshaking: weakref.WeakSet[Connection] = weakref.WeakSet()
        self.handshake_timeout = settings.handshake_timeout
        self.ws_enabled = config.ws != "none"  # hand WebSocket handshakes to aio_websocket
        self.ws_memory = MemoryBudget(config.ws_max_memory)  # WebSocket messages held for the apps
        self.ws_partial = 0  # of which: the parts of messages still arriving
        self.request_memory = MemoryBudget(settings.max_request_memory)  # heads, unread bodies
        self.ws_memory.on_full = self._ws_memory_full
        self.request_memory.on_full = self._request_memory_full
        self.open_websockets = 0  # accepted and not finished: not in in_flight (see aio_websocket)
        self.servers: list[asyncio.AbstractServer] = []
        self.proxy = settings.proxy
        self.proxied: list[ProxiedListener] = []  # listeners read for a PROXY header (proxy on)
        self.in_flight = 0
        self.stopping = False
        self.adopting = 0  # connections from the backlog on their way to a protocol
        self.drain_until = 0.0
        self.websockets_until = 0.0  # a retirement's stop: open WebSockets are served on until then
        self.exiting = False
        self.connections_peak = 0  # the most connections at once since the last trim (see tick)
        self.flood_trim = FloodTrim()
        self.safe_point_requested = False
        self.serving = False  # lifespan startup done and listening: safe points allowed
        self._drained: asyncio.Future[None] | None = None
        self._drain_confirming = False
        self._tick_handle: asyncio.TimerHandle | None = None
        self._held_heads: list[HttpCycle] = []

    async def main(self) -> None:
        """Lifespan startup, serve until a graceful stop, drain, lifespan shutdown."""
        loop = self.loop
        self._drained = loop.create_future()
        loop.add_reader(self.control.fileno(), self.on_control)
        self._tick_handle = loop.call_later(TICK, self.tick)
        await self.lifespan.startup()
        if not self.stopping:
            for context in set(self.settings.tls.values()):  # (this process's copy of the context)
                context.set_alpn_protocols(alpn_protocols(self.config))
            for sock in self.listeners:
                ctx = self.settings.tls.get(sock.fileno())
                if self.proxy is not None:
                    self.proxied.append(ProxiedListener(self, sock, ctx, self.proxy))
                    continue
                server = await loop.create_server(
                    self._protocol_factory(ctx is not None), sock=sock, backlog=self.config.backlog,
                    **self._tls(ctx),
                )
                self.servers.append(server)
            self.serving = True
            self.control.ready_for_requests()
            self.check_control()
        await self._drained
        try:
            await asyncio.wait_for(self.lifespan.shutdown(), max(self.config.graceful_timeout, 1.0))
        except asyncio.TimeoutError:
            log.error("ASGI lifespan shutdown did not finish within graceful_timeout")

    def hold_head(self, cycle: HttpCycle) -> None:
        """Flush held-back heads after this loop iteration; one callback for all connections."""
        self._held_heads.append(cycle)
        if len(self._held_heads) == 1:
            self.loop.call_soon(self._flush_heads)

    def _flush_heads(self) -> None:
        held, self._held_heads = self._held_heads, []
        for cycle in held:
            if cycle.response.held_head is not None:
                cycle.flush_head()

    def on_control(self) -> None:
        self.control.on_readable()
        self.check_control()

    def check_control(self) -> None:
        control = self.control
        if control.exit_now:
            self.exiting = True
            self.loop.stop()
        elif control.stopping and not self.stopping:
            self.begin_stop()
        elif control.safe_point_wanted:
            self.idle()

    def tick(self) -> None:
        self._tick_handle = self.loop.call_later(TICK / 4 if self.stopping else TICK, self.tick)
        self.control.tick()
        self.check_control()
        now = self.loop.time()
        timeouts = self.timeouts
        drain_until = self.drain_until if self.stopping else 0.0
        for conn in list(self.connections):
            conn.sweep(now, timeouts, drain_until)
        self.ws_memory.nudge()
        self.request_memory.nudge()
        # a flood of buffered bytes or of connections is over: give the freed heap back
        ebbed = self.ws_memory.ebbed() | self.request_memory.ebbed() | self._connections_ebbed()
        self.flood_trim.tick(ebbed, (len(self.connections), self.request_memory.used, self.ws_memory.used))
        if self.stopping:
            if self.websockets_until and self.control.server_draining:
                self._close_websockets()  # the whole server stops now: 1001 within its grace
            self.check_drained()

    def _connections_ebbed(self) -> bool:
        """True (once) when the connections fell to a quarter of a peak of FLOOD or more: what they
        held outside the budgets (TLS buffers above all) is freed, amid the heap's live objects."""
        now = len(self.connections)
        if now > self.connections_peak:
            self.connections_peak = now
        elif self.connections_peak >= FLOOD and now * 4 <= self.connections_peak:
            self.connections_peak = now
            return True
        return False

    def _request_memory_full(self) -> None:
        """--max-request-memory filled up: every connection receiving a body stops reading now
        (each would read ahead once more before it heard), until there is room again."""
        for conn in self.connections:
            if type(conn) is HttpProtocol and conn.reading is not None:
                conn.pause_reading()

    def _ws_memory_full(self) -> None:
        """--ws-max-memory filled up: every WebSocket stops reading now, until there is room."""
        for conn in self.connections:
            if type(conn) is WebSocketProtocol:
                conn.memory_full()

    def idle(self) -> None:
        """No request in flight: if a safe point is wanted, leave run_forever to take it there."""
        if self.in_flight == 0 and self.serving and not self.stopping and self.control.safe_point_wanted:
            self.safe_point_requested = True
            self.loop.stop()
        if self.stopping:
            self.check_drained()

    def begin_stop(self) -> None:
        """Stop accepting and finish: the HTTP connections within --graceful-timeout; the open
        WebSockets with them, or, when this worker is retired while its replacement serves
        (control.websocket_grace), served on until they close or the grace passes (1012 then)."""
        self.stopping = True
        now = self.loop.time()
        self.drain_until = self.timeouts.drain_until(now)
        if self.control.server_draining and self.serving:
            self._take_backlog()
        stop_accepting(self.loop, self.servers, self.listeners)
        for listener in self.proxied:
            listener.close()
        grace = 0.0 if self.control.server_draining else self.control.websocket_grace
        if grace:
            self.websockets_until = now + grace
            self.loop.call_at(self.websockets_until, self._close_websockets)
        for conn in list(self.connections):
            if not (grace and type(conn) is WebSocketProtocol):
                conn.stop()
        self.loop.call_at(now + self.config.graceful_timeout, self._graceful_timeout)
        self.check_drained()

    def _close_websockets(self) -> None:
        """The WebSockets' grace is over (1012), or the whole server stops (1001): they close now,
        within --graceful-timeout."""
        if self.websockets_until:
            self.websockets_until = 0.0
            for conn in list(self.connections):
                if type(conn) is WebSocketProtocol:
                    conn.stop()
            self.loop.call_at(self.loop.time() + self.config.graceful_timeout, self._graceful_timeout)

    def _take_backlog(self) -> None:
        """The server stops: accept what waits in the listen backlog (before server.close() lets go
        of the listener) and serve it, so a queued connection is not reset."""
        for listener in self.proxied:
            listener.accept(1 << 30)
        for sock in self.listeners if not self.proxied else ():
            while True:
                try:
                    conn, _ = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                conn.setblocking(False)
                self.adopting += 1
                ctx = self.settings.tls.get(sock.fileno())
                adopt = self.loop.connect_accepted_socket(
                    self._protocol_factory(ctx is not None), conn, **self._tls(ctx)
                )
                task = self.loop.create_task(adopt)
                task.add_done_callback(self._adopted)

    def _tls(self, ctx: Any) -> dict[str, Any]:
        """TLS arguments of a listener: the opening handshake is bounded by --ssl-handshake-timeout;
        the closing one waits for the client's close_notify as long as a cleartext close lingers
        (LINGER; asyncio's own wait is 30 s, holding a drain), since meanwhile uvloop's SSL layer
        keeps whatever the client still sends, unbounded, where a cleartext close drops it."""
        if ctx is None:
            return {"ssl": None}
        bounds = {"ssl_handshake_timeout": self.handshake_timeout}
        if sys.version_info >= (3, 11) or type(self.loop).__module__.startswith("uvloop"):
            bounds["ssl_shutdown_timeout"] = min(self.handshake_timeout, LINGER)  # (asyncio: 3.11+)
        return {"ssl": ctx, **bounds}

    def _protocol_factory(self, tls: bool) -> Callable[[], HttpProtocol]:
        """A plain connection's protocol counts as arriving from its making (see check_drained); a
        TLS one as handshaking until connection_made (see _handshakes_hold)."""
        made = self.handshaking if tls else self.arriving

        def making() -> HttpProtocol:
            protocol = HttpProtocol(self)
            made.add(protocol)
            return protocol

        return making

    def _adopted(self, task: asyncio.Task[Any]) -> None:
        self.adopting -= 1
        if not task.cancelled() and task.exception() is not None:
            log.warning("could not serve a connection from the backlog: %s", task.exception())
        self.check_drained()

    def check_drained(self) -> None:
        """Resolve the drain (the worker then exits) once stopping and nothing is left, confirmed
        one loop iteration later; a connection going while the worker serves ends nothing.

        asyncio accepts in one iteration and makes the connection's protocol in the next (a task);
        a connection accepted just before the listeners closed is invisible until then, and ending
        the loop now would close it unanswered.
        """
        if not self.stopping or self._drain_confirming or not self._idle():
            return
        self._drain_confirming = True
        self.loop.call_soon(self._confirm_drained, 2)

    def _confirm_drained(self, hops: int) -> None:
        """Two iterations: a task an accept scheduled in the same iteration as the first hop has
        run (and made its protocol) before the second."""
        if not self._idle():
            self._drain_confirming = False
        elif hops > 1:
            self.loop.call_soon(self._confirm_drained, hops - 1)
        else:
            self._drain_confirming = False
            drained = self._drained
            if drained is not None and not drained.done():
                drained.set_result(None)

    def _idle(self) -> bool:
        return (
            self.in_flight == 0
            and not self.open_websockets
            and not self.adopting
            and not self.connections
            and not self.arriving
            and not self._handshakes_hold()
        )

    def _handshakes_hold(self) -> bool:
        """A TLS handshake under way when the stop came holds the drain as an idle connection
        does, for the drain's grace (drain_until): a client that finishes it then is served, as on
        a plain connection; one that failed (it never calls back) or stalls holds it no longer."""
        return bool(self.handshaking) and self.loop.time() < self.drain_until

    def _graceful_timeout(self) -> None:
        if self._drained is None or self._drained.done():
            return
        late = [c for c in self.connections if not (self.websockets_until and type(c) is WebSocketProtocol)]
        if late:
            log.warning("graceful timeout: closing %d connection(s)", len(late))
        for conn in late:
            conn.transport.abort()
        if not self.websockets_until:
            self._drained.set_result(None)


def serve_asgi(
    listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
    settings: ServingSettings,
) -> None:
    """Serve ASGI http on the listeners until control says stop (see WorkerControl).

    Safe points are taken between two run_forever() calls, not inside a callback: when
    at_safe_point() forks and raises in the child, no loop iteration is half done there and no
    poll can run in the child on the epoll instance it shares with the parent.
    """
    loop = new_event_loop(config)
    asyncio.set_event_loop(loop)
    srv = Server(loop, listeners, app, config, control, settings)
    main = loop.create_task(srv.main())
    main.add_done_callback(lambda _: loop.stop())
    forked = False
    try:
        while True:
            loop.run_forever()
            if main.done() or srv.exiting:
                break
            if srv.safe_point_requested:
                srv.safe_point_requested = False
                if srv.in_flight == 0 and control.safe_point_wanted and not srv.stopping:
                    try:
                        control.at_safe_point()
                    except SystemExit:
                        forked = True
                        _abandon_after_fork(loop, srv)
                        raise
        if main.done() and not main.cancelled():
            main.result()  # a LifespanFailure: the worker reports it (refork.errors.StartupError)
    finally:
        if not forked:
            _close(loop, srv, main)


def stop_accepting(loop: asyncio.AbstractEventLoop, servers: list[asyncio.AbstractServer],
                   listeners: list[socket.socket]) -> None:  # fmt: skip
    """Accept no more now; close the servers two loop iterations later. asyncio makes an accepted
    connection's transport in a task of the next iteration, and a server closed by then refuses
    it (an assertion asyncio swallows): that connection would be neither served nor closed, its
    client waiting and a drain held (its protocol counts as arriving)."""
    if servers:  # (each serves one of the listeners; uvloop's are no readers: its accepts are whole)
        for sock in listeners:
            loop.remove_reader(sock.fileno())

    def close() -> None:
        for server in servers:
            server.close()

    loop.call_soon(loop.call_soon, close)


def _close(loop: asyncio.AbstractEventLoop, srv: Server, main: asyncio.Task[None]) -> None:
    """Tear the loop down in the worker itself (graceful stop done, exit_now, or an error)."""
    try:
        if srv._tick_handle is not None:
            srv._tick_handle.cancel()
        try:
            loop.remove_reader(srv.control.fileno())
        except (OSError, ValueError):
            pass
        for conn in list(srv.connections):
            conn.transport.abort()
        for server in srv.servers:
            server.close()
        for listener in srv.proxied:
            listener.close()
            for fd in listener.fds():
                os.close(fd)
        tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.wait(tasks, timeout=0.5 if srv.exiting else 2.0))
        loop.run_until_complete(asyncio.sleep(0))  # let aborted transports close their sockets
        loop.run_until_complete(loop.shutdown_asyncgens())
    except BaseException:
        log.debug("error while closing the event loop", exc_info=True)
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def _abandon_after_fork(loop: asyncio.AbstractEventLoop, srv: Server) -> None:
    """In a forked child unwinding to become a mold: let go of the parent's I/O, touch nothing.

    The child shares the parent's epoll instance and client sockets (same open file
    descriptions). Any epoll_ctl here would change the *parent's* registrations, and a finalizer
    running the app's cleanup (lifespan, background tasks) would talk on the parent's connections.
    So: give every inherited epoll fd number a fresh private instance, point the client
    connection fds at /dev/null (the parent keeps the real sockets; our copies must not keep
    them open), and keep every loop object referenced forever so nothing is ever finalized.
    """
    try:
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[eventpoll]":
                    fresh = select.epoll()
                    os.dup2(fresh.fileno(), int(name))
                    fresh.close()
            except OSError:
                continue
    except OSError:
        log.debug("releasing inherited I/O after fork failed", exc_info=True)
    release_after_fork(_client_fds(srv))
    _ABANDONED.append((loop, srv, list(asyncio.all_tasks(loop))))
    asyncio.set_event_loop(None)


def _client_fds(srv: Server) -> list[int]:
    """The client sockets a forked child must let go of: those of the connections, those waiting
    for a PROXY header, and any other accepted from a listener (its protocol still to be made)."""
    fds = [fd for listener in srv.proxied for fd in listener.fds()]
    fds += accepted_fds(srv.listeners)
    for conn in srv.connections:
        sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
        if sock is not None:
            fds.append(sock.fileno())
    return fds
