"""ASGI connection loop on asyncio or uvloop: one Protocol per connection, one Task per request.

The protocol feeds bytes to the sans-IO :class:`RequestParser` and hands each complete request
head to a :class:`refork.asgi.HttpCycle`, which runs the app; the protocol drives the cycle and
the cycle answers through its :class:`refork.asgi.Channel` only. The deadlines of
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
from collections import deque
from typing import Any

from refork.asgi import HttpCycle, Lifespan, LifespanFailure, build_scope
from refork.config import Config
from refork.http.events import Body, Event, ParseError, Request
from refork.http.forwarded import TrustedProxies
from refork.http.parser import RequestParser
from refork.http.response import simple_response
from refork.logs import AccessLog
from refork.serving.connection import (
    TICK,
    Expiry,
    Phase,
    Timeouts,
    log_access,
    log_write_timeout,
    release_after_fork,
    request_limits,
)
from refork.serving.contract import WorkerControl

log = logging.getLogger("refork")

MAX_PIPELINE = 32  # queued pipelined requests before we stop reading the socket
_IDLE, _HEAD, _BODY = Phase.IDLE, Phase.HEAD, Phase.BODY

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


class HttpProtocol(asyncio.Protocol):
    """One client connection: parse, queue pipelined requests, run them in order.

    It drives each request's :class:`HttpCycle` (body pieces, end of body, client gone, writable
    again) and is the cycle's :class:`refork.asgi.Channel`: the four calls it answers through.
    """

    __slots__ = (
        "srv", "loop", "parser", "transport", "server_addr", "client_addr", "cycle", "reading",
        "queue", "read_paused", "write_blocked_since", "closing", "since", "pending_error", "eof",
        "trusted", "body_bytes",
    )  # fmt: skip

    def __init__(self, srv: Server) -> None:
        self.srv = srv
        self.loop = srv.loop
        self.parser = RequestParser(srv.limits)
        self.transport: Any = None
        self.server_addr: tuple[str, int | None] | None = None
        self.client_addr: tuple[str, int] | None = None
        self.cycle: HttpCycle | None = None  # the request the app is working on
        self.reading: HttpCycle | None = None  # the request whose body is still arriving
        self.queue: deque[HttpCycle] = deque()
        self.read_paused = False
        self.write_blocked_since = 0.0  # when the transport's buffer filled up; 0: it did not
        self.closing = False
        self.since = srv.loop.time()  # start of the current Phase (see sweep())
        self.pending_error = 0
        self.eof = False
        self.trusted = False
        self.body_bytes = 0  # of the request being received: each --body-min-rate extends its deadline

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sockname = transport.get_extra_info("sockname")
        if isinstance(sockname, tuple):
            self.server_addr = (sockname[0], sockname[1])
            peer = transport.get_extra_info("peername")
            self.client_addr = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        else:  # AF_UNIX: path (str or bytes) and no client address
            if isinstance(sockname, bytes):
                sockname = sockname.decode("utf-8", "surrogateescape")
            self.server_addr = (sockname or "", None)
        proxies = self.srv.proxies  # a unix-socket peer (no client address) is None to trusts()
        self.trusted = proxies is not None and proxies.trusts(self.client_addr and self.client_addr[0])
        self.srv.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.cycle is None and not self.parser.in_message:
            self.since = self.loop.time()  # a head starts: the header clock runs
        try:
            events = self.parser.feed(data)
        except ParseError as exc:
            self.handle(exc.events)  # the requests before the bad one are answered first
            self.parse_failed(exc)
            return
        except Exception:
            log.exception("error parsing a request")
            self.parse_failed(ParseError(400, "unparsable request"))
            return
        self.handle(events)

    def handle(self, events: list[Event]) -> None:
        for event in events:
            kind = type(event)
            if kind is Body:
                self.body_bytes += len(event.data)  # type: ignore[union-attr]
                if self.reading.body_received(event.data):  # type: ignore[union-attr]
                    self.pause_reading()
            elif kind is Request:
                self.request_received(event)  # type: ignore[arg-type]
            else:
                self.reading.end_received()  # type: ignore[union-attr]
                self.reading = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        srv = self.srv
        srv.connections.discard(self)
        if self.cycle is not None:
            self.cycle.client_gone()
        self.queue.clear()
        self.reading = None
        self.write_blocked_since = 0.0
        if srv.stopping and not srv.connections:
            srv.check_drained()

    def pause_writing(self) -> None:
        self.write_blocked_since = self.loop.time()

    def resume_writing(self) -> None:
        self.write_blocked_since = 0.0
        if self.cycle is not None:
            self.cycle.resume_sending()
        elif self.queue and not self.closing:
            self.start_next()

    def eof_received(self) -> bool | None:
        # Half-close from the client: finish what is queued, then close (returning None closes).
        self.eof = True
        if self.cycle is None and not self.queue:
            self.closing = True
            return None
        reading = self.reading
        if reading is not None:
            # The body can never complete: to the app this is a disconnect.
            reading.client_gone()
            self.queue.clear()
        return True

    # The Channel of the running cycle --------------------------------------------------------

    def write(self, data: bytes) -> bool:
        if self.closing:
            return True  # nothing goes out any more: nothing to wait for either
        self.transport.write(data)
        return not self.write_blocked_since

    def body_taken(self) -> None:
        if self.read_paused:
            self.maybe_resume_reading()

    def hold_head(self, cycle: HttpCycle) -> None:
        self.srv.hold_head(cycle)

    def cycle_done(self, cycle: HttpCycle, keep_alive: bool) -> None:
        """The response is written (or abandoned): account for it and move on to the next one."""
        srv = self.srv
        srv.in_flight -= 1
        srv.control.request_finished(cycle.token, cycle.response.status)
        if srv.access_log is not None:
            response = cycle.response
            log_access(srv.access_log, cycle.request, cycle.remote, response.status, response.body_bytes,
                       self.loop.time() - cycle.started_at)  # fmt: skip
        if self.cycle is cycle:
            self.cycle = None
        if not keep_alive or self.closing or srv.stopping or (self.eof and not self.queue):
            self.close()
        else:
            self.since = self.loop.time()
            if self.reading is cycle and self.read_paused:
                self.maybe_resume_reading()  # drain and drop the unread body
            if self.queue:
                if not self.write_blocked_since:
                    self.start_next()
            elif self.pending_error:
                self.send_error(self.pending_error)
        if srv.in_flight == 0:
            srv.idle()

    def client_wait(self, cycle: HttpCycle, waiting: bool) -> None:
        control = self.srv.control
        if waiting:
            control.request_waiting(cycle.token)
        else:
            control.request_resumed(cycle.token)

    # Requests --------------------------------------------------------------------------------

    def request_received(self, request: Request) -> None:
        cycle = HttpCycle(self, self.loop, request, keep_alive=not self.srv.stopping)
        self.reading = cycle
        if request.content_length or request.chunked:
            self.since = self.loop.time()  # the body deadline runs from the end of the head
            self.body_bytes = 0
        if self.cycle is None and not self.write_blocked_since:
            self.start(cycle)
        else:
            self.queue.append(cycle)
            if len(self.queue) > MAX_PIPELINE:
                self.pause_reading()

    def start(self, cycle: HttpCycle) -> None:
        srv = self.srv
        if srv.stopping:
            cycle.close_after()
        self.cycle = cycle
        srv.in_flight += 1
        cycle.token = srv.control.request_started(cycle.request.method, cycle.request.path)
        scope = build_scope(
            cycle.request,
            server=self.server_addr,
            client=self.client_addr,
            root_path=srv.root_path,
            proxies=srv.proxies if self.trusted else None,
            state=srv.lifespan.state,
        )
        if srv.access_log is not None:
            cycle.started_at = self.loop.time()
            client = scope["client"]
            cycle.remote = client[0] if client else None
        cycle.task = self.loop.create_task(cycle.run(srv.app, scope))

    def start_next(self) -> None:
        cycle = self.queue.popleft()
        if self.read_paused:
            self.maybe_resume_reading()
        self.start(cycle)

    def parse_failed(self, exc: ParseError) -> None:
        """Answer the requests before the bad bytes first, then the error, then close.

        When the bad bytes are in the body of a request (a malformed chunk, an endless trailer
        section), that request can never complete: its app sees http.disconnect, and the error
        is its answer if it has not started one (else the connection just closes).
        """
        reading = self.reading
        if reading is not None:
            self.reading = None
            if reading is self.cycle:
                reading.client_gone()
                if reading.response_started:
                    self.close()
                else:
                    reading.response.status = exc.status  # what the access log shows for it
                    self.send_error(exc.status)
                return
            if reading in self.queue:  # behind the running request: it never starts
                self.queue.remove(reading)
            else:  # answered already (its app did not wait for the body): nothing more to say
                self.close()
                return
        if self.cycle is not None or self.queue:
            self.pending_error = exc.status
            self.pause_reading()
        else:
            self.send_error(exc.status)

    def send_error(self, status: int) -> None:
        if not self.closing:
            self.transport.write(simple_response(status))
            self.close()

    # Flow control, deadlines and closing -----------------------------------------------------

    def pause_reading(self) -> None:
        if not self.read_paused and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()

    def maybe_resume_reading(self) -> None:
        reading = self.reading
        if reading is not None and reading.backlogged:
            return
        if len(self.queue) > MAX_PIPELINE or self.pending_error or self.closing:
            return
        self.read_paused = False
        self.transport.resume_reading()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.queue.clear()
            self.transport.close()

    def stop(self) -> None:
        """Graceful stop: let the current response finish and then close.

        Idle connections are closed by sweep() when the drain grace ends (see
        refork.serving.connection).
        """
        if self.cycle is not None:
            self.cycle.close_after()
            self.queue.clear()

    def sweep(self, now: float, timeouts: Timeouts, drain_until: float) -> None:
        """Apply the connection contract's deadlines (once a second, from Server.tick)."""
        if timeouts.write_stalled(self.write_blocked_since, now):
            cycle = self.cycle
            log_write_timeout(timeouts.write, self.client_addr, cycle.request if cycle is not None else None)
            self.transport.abort()  # the client stopped reading: connection_lost follows
            return
        if self.closing:
            return
        reading = self.reading
        if reading is not None:
            phase = _BODY  # also while the app runs: it may be waiting in receive()
        elif self.cycle is not None or self.queue:
            return  # the app has it: the worker's --timeout applies
        elif self.parser.in_message:
            phase = _HEAD
        else:
            phase = _IDLE
        verdict = timeouts.expiry(phase, self.since, now, drain_until, self.body_bytes)
        if verdict is Expiry.CLOSE:
            self.close()
        elif verdict is Expiry.REQUEST_TIMEOUT:
            other = self.cycle is not None and self.cycle is not reading  # a pipelined predecessor
            if other or (reading is not None and reading.response_started):
                self.close()  # too late for a 408: a response is (being) written
            else:
                if reading is not None:
                    reading.response.status = 408  # what the access log shows for it
                self.send_error(408)


class Server:
    """Per-worker state shared by all connections: app, config, control, counters."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        listeners: list[socket.socket],
        app: Any,
        config: Config,
        control: WorkerControl,
    ) -> None:
        self.loop = loop
        self.listeners = listeners
        self.app = app
        self.config = config
        self.control = control
        self.limits = request_limits(config)
        self.proxies = TrustedProxies(config.forwarded_allow_ips) if config.forwarded_allow_ips else None
        self.root_path = config.root_path
        self.lifespan = Lifespan(app)
        self.access_log = AccessLog.from_config(config)
        self.timeouts = Timeouts.from_config(config)
        self.connections: set[HttpProtocol] = set()
        self.servers: list[asyncio.AbstractServer] = []
        self.in_flight = 0
        self.stopping = False
        self.drain_until = 0.0
        self.exiting = False
        self.safe_point_requested = False
        self.serving = False  # lifespan startup done and listening: safe points allowed
        self._drained: asyncio.Future[None] | None = None
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
            for sock in self.listeners:
                server = await loop.create_server(
                    lambda: HttpProtocol(self), sock=sock, backlog=self.config.backlog
                )
                self.servers.append(server)
            self.serving = True
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
            if cycle.response.head_pending:
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
        if self.stopping:
            self.check_drained()

    def idle(self) -> None:
        """No request in flight: if a safe point is wanted, leave run_forever to take it there."""
        if self.in_flight == 0 and self.serving and not self.stopping and self.control.safe_point_wanted:
            self.safe_point_requested = True
            self.loop.stop()
        if self.stopping:
            self.check_drained()

    def begin_stop(self) -> None:
        self.stopping = True
        self.drain_until = self.timeouts.drain_until(self.loop.time())
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            conn.stop()
        deadline = self.loop.time() + self.config.graceful_timeout
        self.loop.call_at(deadline, self._graceful_timeout)
        self.check_drained()

    def check_drained(self) -> None:
        drained = self._drained
        if self.in_flight == 0 and not self.connections and drained is not None and not drained.done():
            drained.set_result(None)

    def _graceful_timeout(self) -> None:
        if self._drained is not None and not self._drained.done():
            log.warning("graceful timeout: closing %d connection(s)", len(self.connections))
            for conn in list(self.connections):
                conn.transport.abort()
            self._drained.set_result(None)


def serve_asgi(
    listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl
) -> None:
    """Serve ASGI http on the listeners until control says stop (see WorkerControl).

    Safe points are taken between two run_forever() calls, not inside a callback: when
    at_safe_point() forks and raises in the child, no loop iteration is half done there and no
    poll can run in the child on the epoll instance it shares with the parent.
    """
    loop = new_event_loop(config)
    asyncio.set_event_loop(loop)
    srv = Server(loop, listeners, app, config, control)
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
            exc = main.exception()
            if isinstance(exc, LifespanFailure):
                log.error("%s; worker exiting", exc)
            main.result()
    finally:
        if not forked:
            _close(loop, srv, main)


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
    fds = []
    for conn in srv.connections:
        sock = conn.transport.get_extra_info("socket") if conn.transport is not None else None
        if sock is not None:
            fds.append(sock.fileno())
    return fds
