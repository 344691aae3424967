"""receive() / send(): the app side of one request on a connection.

:class:`HttpCycle` keeps one explicit :class:`CycleState`; the connection
(:mod:`refork.serving.asgi.server`) drives it and it answers only through the :class:`Channel`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from types import CoroutineType
from typing import Any, Protocol

from refork.asgi.files import file_source
from refork.asgi.response import EARLY_HINT, OTHER_MESSAGES, ResponseState
from refork.asgi.waiting import wake
from refork.http.budget import MemoryBudget
from refork.http.events import Request
from refork.http.response import CONTINUE, simple_response

try:
    from refork._native import AppSteps  # typed by refork/_native.pyi
except ImportError:  # not built: every start holds its head for the flush after the loop iteration
    AppSteps = None  # type: ignore[assignment,misc]

log = logging.getLogger("refork")

HIGH_WATER = 256 * 1024  # buffered request body bytes before the connection stops reading


class ClientDisconnected(OSError):
    """``send()`` after the client went away (ASGI spec 2.4: an OSError subclass)."""


class CycleState(enum.Enum):
    """Where one request/response exchange is: the one state an :class:`HttpCycle` keeps."""

    RECEIVING_BODY = "receiving body"  # the body is still arriving; no response yet
    BODY_DONE = "body done"  # the whole body arrived; no response yet
    STREAMING = "streaming"  # the response started while the body is still arriving
    RESPONSE_STARTED = "response started"  # the response started; the whole body arrived
    RESPONSE_DONE = "response done"  # complete or abandoned, and the connection was told
    DISCONNECTED = "disconnected"  # the client went away before the response was done


# Module constants: an `is` test against a global is cheaper than an enum attribute lookup.
_RECEIVING_BODY = CycleState.RECEIVING_BODY
_BODY_DONE = CycleState.BODY_DONE
_STREAMING = CycleState.STREAMING
_RESPONSE_STARTED = CycleState.RESPONSE_STARTED
_RESPONSE_DONE = CycleState.RESPONSE_DONE
_DISCONNECTED = CycleState.DISCONNECTED


class Channel(Protocol):
    """The one way an :class:`HttpCycle` reaches its connection (serving.asgi.http_protocol.HttpProtocol).

    The connection drives the cycle (body pieces, end of body, client gone, writable again); the
    cycle only ever answers through these six calls.
    """

    def write(self, data: bytes) -> bool:
        """Send bytes (dropped once the connection is closing); False: wait for resume_sending()."""

    def body_taken(self) -> None:
        """Buffered body bytes were taken by the app (or dropped): reading may resume."""

    def hold_head(self, cycle: HttpCycle) -> None:
        """Call cycle.flush_head() after this loop iteration (one callback for all connections)."""

    def cycle_done(self, cycle: HttpCycle, keep_alive: bool) -> None:
        """The response is complete or abandoned: account for it and go on to the next request."""

    def client_wait(self, cycle: HttpCycle, waiting: bool) -> None:
        """The app starts (True) or stops (False) waiting on the client: body bytes or write room.

        Time spent waiting is not the app's: it does not count against the worker's --timeout.
        """

    async def send_file(self, fd: int, offset: int, count: int) -> int:
        """Write `count` bytes of the file `fd` from `offset` (os.sendfile where the transport allows,
        else read and write); returns the bytes sent (fewer: the file was shorter). Raises
        ClientDisconnected when the connection is lost on the way."""


class HttpCycle:
    """One request/response: the receive() and send() the app sees, and the unread request body.

    ``token``, ``task``, ``started_at``, ``remote`` and ``hook_request`` are the connection's
    bookkeeping.
    """

    __slots__ = (
        "channel", "loop", "request", "response", "state", "unread", "buffered", "memory", "continue_owed",
        "receive_waiter", "send_waiter", "token", "task", "started_at", "remote", "eof", "hook_request",
        "stepping",
    )  # fmt: skip

    def __init__(
        self, channel: Channel, loop: asyncio.AbstractEventLoop, request: Request, *, keep_alive: bool = True,
        memory: MemoryBudget | None = None,
    ) -> None:
        self.channel = channel
        self.loop = loop
        self.request = request
        self.response = ResponseState(request, keep_alive=keep_alive)
        self.state = _RECEIVING_BODY
        self.unread: list[bytes] | None = []  # None: the app has had the last body message
        self.buffered = 0
        self.memory = memory  # the worker's --max-request-memory, charged with `buffered`
        self.continue_owed = request.expect_continue  # "100 Continue" not sent yet
        self.receive_waiter: asyncio.Future[None] | None = None
        self.send_waiter: asyncio.Future[None] | None = None
        self.token: object = None
        self.task: asyncio.Task[None] | None = None
        self.started_at = 0.0
        self.remote: str | None = None
        self.eof = False  # the client half-closed after the whole request: see peer_closed()
        self.hook_request: Any = None  # the `req` of gunicorn's pre_request/post_request hooks
        self.stepping = False  # a step of the request's own task runs (AppSteps sets it around each)

    # Driven by the connection ----------------------------------------------------------------

    def body_received(self, data: bytes) -> bool:
        """Queue a body piece for receive(); True when reading should stop (see backlogged)."""
        unread = self.unread
        if unread is None:
            return False  # the response is done: the rest of the body is read and dropped
        unread.append(data)
        self.buffered += len(data)
        memory = self.memory
        if memory is not None:
            memory.charge(len(data))
        self._wake_receive()
        return self.buffered > HIGH_WATER or (memory is not None and memory.full)

    def _let_go(self) -> None:
        """The buffered body is taken or dropped: its bytes are no longer held for the app."""
        n = self.buffered
        self.buffered = 0
        if n and self.memory is not None:
            self.memory.give_back(n)

    def end_received(self) -> None:
        state = self.state
        if state is _RECEIVING_BODY:
            self.state = _BODY_DONE
        elif state is _STREAMING:
            self.state = _RESPONSE_STARTED
        if self.receive_waiter is not None:
            self._wake_receive()

    def client_gone(self) -> None:
        """The connection closed (or the client half-closed before the whole body arrived)."""
        state = self.state
        if state is _RESPONSE_DONE or state is _DISCONNECTED:
            return
        if state is _RECEIVING_BODY or state is _STREAMING:
            self.unread = None  # a body that can never complete is not handed to the app
            self._let_go()
        self.state = _DISCONNECTED
        self._wake_receive()
        self.resume_sending()

    def peer_closed(self) -> None:
        """The client sent EOF after the whole request: it can send nothing more.

        To receive() that is a disconnect (the cue a long poll or an event stream waits for),
        delivered at once, and once the app has had it send() raises ClientDisconnected. An app
        that does not ask still writes: a client that only half-closed may still read, and one
        that closed for good answers the next write with a reset (connection_lost, then send()
        raises).
        """
        self.eof = True
        self._wake_receive()

    def resume_sending(self) -> None:
        """The transport's buffer drained (or the client is gone): a waiting send() goes on."""
        waiter, self.send_waiter = self.send_waiter, None
        wake(waiter)

    def close_after(self) -> None:
        """Close the connection after this response ("Connection: close" if not framed yet)."""
        self.response.keep_alive = False

    @property
    def backlogged(self) -> bool:
        """More unread body than HIGH_WATER, or the worker's --max-request-memory is full while
        this request holds some: the connection must not read on."""
        if self.unread is None or not self.buffered:
            return False
        return self.buffered > HIGH_WATER or (self.memory is not None and self.memory.full)

    @property
    def response_started(self) -> bool:
        return self.response.started

    def step_held(self) -> None:
        """A step of the request's task ended with the head still held (AppSteps calls it): it goes
        out after this loop iteration, as a head started from another task does."""
        self.channel.hold_head(self)

    def flush_head(self) -> None:
        head = self.response.take_head()
        if head and self.state is not _DISCONNECTED:
            self.channel.write(head)

    def _wake_receive(self) -> None:
        waiter, self.receive_waiter = self.receive_waiter, None
        wake(waiter)

    # The app side ----------------------------------------------------------------------------

    async def run(self, app: Any, scope: dict[str, Any]) -> None:
        """Call the app; whatever happens, the connection hears of the end exactly once."""
        try:
            call = app(scope, self.receive, self.send)
            if AppSteps is not None and call.__class__ is CoroutineType:
                result = await AppSteps(call, self)  # (it sees each step end: step_held())
            else:
                result = await call
        except BaseException as exc:
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            self.failed(exc)
        else:
            if result is not None:
                log.error("ASGI callable should return None, but returned %r", result)
            if not self.response.complete:
                self.incomplete()

    async def receive(self) -> dict[str, Any]:
        while True:
            unread = self.unread
            state = self.state
            if unread:
                data = unread[0] if len(unread) == 1 else b"".join(unread)
                unread.clear()
                self._let_go()
                more = state is _RECEIVING_BODY or state is _STREAMING
                if not more:
                    self.unread = None
                self.channel.body_taken()
                return {"type": "http.request", "body": data, "more_body": more}
            if unread is not None and state is not _RECEIVING_BODY and state is not _STREAMING:
                self.unread = None
                return {"type": "http.request", "body": b"", "more_body": False}
            if state is _RESPONSE_DONE or state is _DISCONNECTED:
                return {"type": "http.disconnect"}
            if self.eof:  # told the client is gone: from now on send() raises, as the spec has it
                self.state = _DISCONNECTED
                return {"type": "http.disconnect"}
            if self.continue_owed and state is _RECEIVING_BODY:
                self.continue_owed = False
                self.channel.write(CONTINUE)
            waiter = self.receive_waiter = self.loop.create_future()
            if state is _RECEIVING_BODY or state is _STREAMING:
                await self._wait_on_client(waiter)  # body bytes: the client's time, not the app's
            else:
                await waiter  # the body is done: only a disconnect can wake this

    async def send(self, message: dict[str, Any]) -> None:
        state = self.state
        if state is _DISCONNECTED:
            raise ClientDisconnected("client disconnected")
        response = self.response
        kind = message.get("type") if message.__class__ is dict else None
        if kind in OTHER_MESSAGES:
            if kind == EARLY_HINT:  # (no answer yet: a 100 Continue may still follow)
                hint = response.early_hint(message)
                if hint:
                    self.channel.write(hint)  # (ahead of a held head: that goes out after this step)
                return
            if state is _RECEIVING_BODY and self.continue_owed:
                response.keep_alive = False  # (as below)
            await self._send_file(message)
            return
        if state is _RECEIVING_BODY and self.continue_owed:
            # The client is still waiting for our go-ahead: it may or may not send the body.
            response.keep_alive = False
        if kind == "http.response.start" and not response.started:
            data = response.start(message)  # (straight to its framing: feed()'s hop skipped)
        else:
            data = response.feed(message)
        if state is _RECEIVING_BODY:  # (_started(), inline: once or twice a request)
            self.state = _STREAMING
        elif state is _BODY_DONE:
            self.state = _RESPONSE_STARTED
        writable = True
        if data:
            writable = self.channel.write(data)
        elif response.held_head is not None and not self.stepping:
            # Just started: the head rides with the first body message if that comes in this
            # task step; otherwise (a slow stream) it goes out on its own right after. (In a step
            # of the request's own task AppSteps sees the step end: step_held() then, if held.)
            self.channel.hold_head(self)
        if response.complete:
            self._finish(response.will_keep_alive)
        elif not writable:
            waiter = self.send_waiter = self.loop.create_future()
            await self._wait_on_client(waiter)  # backpressure: the transport is over its high-water mark
            if self.state is _DISCONNECTED:
                raise ClientDisconnected("client disconnected")

    def _started(self) -> None:
        state = self.state
        if state is _RECEIVING_BODY:
            self.state = _STREAMING
        elif state is _BODY_DONE:
            self.state = _RESPONSE_STARTED

    async def _send_file(self, message: dict[str, Any]) -> None:
        """http.response.pathsend / http.response.zerocopysend (ASGI extensions): see asgi/files.py."""
        source = file_source(message)  # raises before anything is written (a missing path, ...)
        try:
            before, after, send = self.response.file_frame(message["type"], source.count, source.more_body)
            self._started()
            channel = self.channel
            if before:
                channel.write(before)
            if send:
                channel.client_wait(self, True)
                try:
                    sent = await channel.send_file(source.fd, source.offset, source.count)
                finally:
                    channel.client_wait(self, False)
                if sent < source.count:
                    raise RuntimeError(f"the file ended {source.count - sent} bytes early")
            source.done()
            if after:
                channel.write(after)
        finally:
            source.close()
        if self.response.complete:
            self._finish(self.response.will_keep_alive)

    async def _wait_on_client(self, waiter: asyncio.Future[None]) -> None:
        channel = self.channel
        channel.client_wait(self, True)
        try:
            await waiter
        finally:
            channel.client_wait(self, False)

    # Endings ---------------------------------------------------------------------------------

    def _finish(self, keep_alive: bool) -> None:
        short = self.response.short_by
        if short:
            log.error("ASGI app sent %d bytes less than its Content-Length: connection closed", short)
        self.state = _RESPONSE_DONE
        self.unread = None
        if self.buffered:
            self._let_go()
        if self.receive_waiter is not None:
            self._wake_receive()
        self.channel.cycle_done(self, keep_alive)

    def failed(self, exc: BaseException) -> None:
        if self.state is _RESPONSE_DONE:
            log.error("Exception in ASGI application after the response was sent", exc_info=exc)
            return
        gone = self.state is _DISCONNECTED or self.eof
        if gone or isinstance(exc, (ClientDisconnected, asyncio.CancelledError)):
            log.debug("ASGI app ended after the client disconnected: %r", exc)
        else:
            log.error("Exception in ASGI application", exc_info=exc)
        self.abort_response()

    def incomplete(self) -> None:
        if self.state is not _DISCONNECTED and not self.eof:
            if self.response.started:
                log.error("ASGI app returned without completing the response")
            else:
                log.error("ASGI app returned without starting a response")
        self.abort_response()

    def abort_response(self) -> None:
        """500 if no byte was sent yet (a held head is dropped), else cut the connection (the client
        sees a short body). Nothing for a client that went away or half-closed."""
        if self.state is _RESPONSE_DONE:
            return
        response = self.response
        if self.state is not _DISCONNECTED and not self.eof and not response.head_sent:
            response.take_head()
            self.channel.write(simple_response(500, b"Internal Server Error"))
            response.status = 500
        self._finish(False)
