"""Where an ASGI app is called: scope, the response message state machine, receive/send, lifespan.

:func:`build_scope` and :class:`ResponseState` are sans-IO: a request event goes in, a scope dict
comes out; ``send()`` messages go in, bytes come out. :class:`HttpCycle` is the app-facing
receive()/send() pair of one request, with one explicit :class:`CycleState`; the connection
(:mod:`refork.serving.aio`) drives it and it answers only through the four-call :class:`Channel`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterable
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

from refork.config import Config
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies, resolve_forwarded
from refork.http.response import CONTINUE, ResponseFramer, simple_response

log = logging.getLogger("refork")

ASGI_INFO = {"version": "3.0", "spec_version": "2.4"}


class ClientDisconnected(OSError):
    """``send()`` after the client went away (ASGI spec 2.4: an OSError subclass)."""


class LifespanFailure(RuntimeError):
    """The app reported (or raised during) lifespan startup: the worker must not serve."""


# ---------------------------------------------------------------------------------------------
# Scope


def decode_path(raw: bytes) -> str:
    """Percent-decode a raw path as UTF-8; undecodable bytes become U+FFFD, never an error."""
    if b"%" in raw:
        raw = unquote_to_bytes(raw)
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return raw.decode("utf-8", "replace")


def build_scope(
    request: Request,
    *,
    server: tuple[str, int | None] | None,
    client: tuple[str, int] | None,
    scheme: str = "http",
    root_path: str = "",
    proxies: TrustedProxies | None = None,
    state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``http`` scope for one request.

    X-Forwarded-Proto/-For are applied only when ``proxies`` trusts the peer. ``root_path`` is
    prepended to ``path``/``raw_path`` unless the request path already carries it (a proxy that
    does not strip the mount point), which is what current ASGI routers expect. ``state`` is
    shallow-copied so one request cannot leak attributes into the next.
    """
    raw_path = request.path
    if proxies is not None:
        peer = client[0] if client else None
        new_scheme, host = resolve_forwarded(request.headers, peer, scheme, proxies)
        if host != peer or new_scheme != scheme:
            scheme = new_scheme
            if host is not None:
                port = client[1] if client and host == peer else 0
                client = (host, port)
    path = decode_path(raw_path)
    if root_path and not path.startswith(root_path):
        path = root_path + path
        raw_path = root_path.encode("utf-8") + raw_path
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": ASGI_INFO,
        "http_version": request.http_version,
        "server": server,
        "client": client,
        "scheme": scheme,
        "method": request.method,
        "root_path": root_path,
        "path": path,
        "raw_path": raw_path,
        "query_string": request.query,
        "headers": request.headers,
    }
    if state is not None:
        scope["state"] = state.copy()
    return scope


# ---------------------------------------------------------------------------------------------
# Response state machine


class ResponseState:
    """Validate the ``send()`` messages of one response and frame them into bytes (sans-IO).

    The head is held back until the first body message so that a small response leaves in one
    write. ``keep_alive`` may be turned off until ``http.response.start`` arrives (graceful stop).
    """

    __slots__ = ("request", "keep_alive", "framer", "started", "complete", "status", "_head")

    def __init__(self, request: Request, *, keep_alive: bool = True) -> None:
        self.request = request
        self.keep_alive = keep_alive
        self.framer: Any = None
        self.started = False
        self.complete = False
        self.status = 0
        self._head: bytes | None = None

    def feed(self, message: dict[str, Any]) -> bytes:
        """Bytes to write for this message (possibly empty); RuntimeError when it is out of order."""
        try:
            kind = message["type"]
        except (KeyError, TypeError):
            raise RuntimeError(f"ASGI message must be a dict with a 'type' key, got {message!r}") from None
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got {kind!r}")
            return self._start(message)
        if self.complete:
            raise RuntimeError(f"Unexpected ASGI message {kind!r} sent after the response completed")
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got {kind!r}")
        body = message.get("body", b"")
        framer = self.framer
        out: bytes
        if body:
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise RuntimeError(f"'body' must be bytes, got {type(body).__name__}")
            try:
                out = framer.body(bytes(body) if type(body) is not bytes else body)
            except ValueError as exc:
                raise RuntimeError(f"Invalid response body: {exc}") from None
        else:
            out = b""
        if not message.get("more_body", False):
            try:
                out += framer.end()
            except ValueError as exc:
                raise RuntimeError(f"Invalid response: {exc}") from None
            self.complete = True
        head = self._head
        if head is not None:
            self._head = None
            return head + out
        return out

    def _start(self, message: dict[str, Any]) -> bytes:
        status = message.get("status")
        if type(status) is not int or not 100 <= status <= 999:
            raise RuntimeError(f"'status' must be an int between 100 and 999, got {status!r}")
        if 100 <= status < 200:
            raise RuntimeError(f"Informational status {status} cannot be sent as the final response")
        headers = _check_headers(message.get("headers", ()))
        framer = ResponseFramer(self.request, server_keep_alive=self.keep_alive)
        try:
            self._head = framer.head(status, headers)
        except ValueError as exc:
            raise RuntimeError(f"Invalid response head: {exc}") from None
        self.framer = framer
        self.status = status
        self.started = True
        return b""

    def take_head(self) -> bytes:
        """The held-back head, if no body message came to carry it; empty afterwards."""
        head = self._head
        self._head = None
        return head or b""

    @property
    def head_pending(self) -> bool:
        return self._head is not None

    @property
    def will_keep_alive(self) -> bool:
        """After completion: may the connection serve another request?"""
        return self.framer is not None and bool(self.framer.keep_alive)

    @property
    def body_bytes(self) -> int:
        return int(self.framer.body_bytes) if self.framer is not None else 0


def _check_headers(headers: Iterable[Any]) -> list[tuple[bytes, bytes]]:
    """Headers as a list of (bytes, bytes); anything else is an app bug worth a clear message."""
    if type(headers) is list:
        for item in headers:
            if type(item) is not tuple or len(item) != 2:
                break
            if type(item[0]) is not bytes or type(item[1]) is not bytes:
                break
        else:
            return headers
    out: list[tuple[bytes, bytes]] = []
    try:
        for name, value in headers:
            if not isinstance(name, bytes) or not isinstance(value, bytes):
                raise RuntimeError(f"Response header names and values must be bytes, got {(name, value)!r}")
            out.append((name, value))
    except (TypeError, ValueError):
        raise RuntimeError(f"'headers' must be an iterable of [name, value] pairs, got {headers!r}") from None
    return out


# ---------------------------------------------------------------------------------------------
# receive() / send(): the app side of one request on a connection

HIGH_WATER = 256 * 1024  # buffered request body bytes before the connection stops reading


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
    """The one way an :class:`HttpCycle` reaches its connection (refork.serving.aio.HttpProtocol).

    The connection drives the cycle (body pieces, end of body, client gone, writable again); the
    cycle only ever answers through these five calls.
    """

    def write(self, data: bytes) -> bool:
        """Send bytes (dropped once the connection is closing); False: wait for resume_sending()."""

    def body_taken(self) -> None:
        """The app took a body backlog bigger than HIGH_WATER: reading may resume."""

    def hold_head(self, cycle: HttpCycle) -> None:
        """Call cycle.flush_head() after this loop iteration (one callback for all connections)."""

    def cycle_done(self, cycle: HttpCycle, keep_alive: bool) -> None:
        """The response is complete or abandoned: account for it and go on to the next request."""

    def client_wait(self, cycle: HttpCycle, waiting: bool) -> None:
        """The app starts (True) or stops (False) waiting on the client: body bytes or write room.

        Time spent waiting is not the app's: it does not count against the worker's --timeout.
        """


class HttpCycle:
    """One request/response: the receive() and send() the app sees, and the unread request body.

    ``token``, ``task``, ``started_at`` and ``remote`` are the connection's bookkeeping.
    """

    __slots__ = (
        "channel", "loop", "request", "response", "state", "unread", "buffered", "continue_owed",
        "receive_waiter", "send_waiter", "token", "task", "started_at", "remote",
    )  # fmt: skip

    def __init__(
        self, channel: Channel, loop: asyncio.AbstractEventLoop, request: Request, *, keep_alive: bool = True
    ) -> None:
        self.channel = channel
        self.loop = loop
        self.request = request
        self.response = ResponseState(request, keep_alive=keep_alive)
        self.state = _RECEIVING_BODY
        self.unread: list[bytes] | None = []  # None: the app has had the last body message
        self.buffered = 0
        self.continue_owed = request.expect_continue  # "100 Continue" not sent yet
        self.receive_waiter: asyncio.Future[None] | None = None
        self.send_waiter: asyncio.Future[None] | None = None
        self.token: object = None
        self.task: asyncio.Task[None] | None = None
        self.started_at = 0.0
        self.remote: str | None = None

    # Driven by the connection ----------------------------------------------------------------

    def body_received(self, data: bytes) -> bool:
        """Queue a body piece for receive(); True when the backlog passed HIGH_WATER (stop reading)."""
        unread = self.unread
        if unread is None:
            return False  # the response is done: the rest of the body is read and dropped
        unread.append(data)
        self.buffered += len(data)
        self._wake_receive()
        return self.buffered > HIGH_WATER

    def end_received(self) -> None:
        state = self.state
        if state is _RECEIVING_BODY:
            self.state = _BODY_DONE
        elif state is _STREAMING:
            self.state = _RESPONSE_STARTED
        self._wake_receive()

    def client_gone(self) -> None:
        """The connection closed (or the client half-closed before the whole body arrived)."""
        state = self.state
        if state is _RESPONSE_DONE or state is _DISCONNECTED:
            return
        if state is _RECEIVING_BODY or state is _STREAMING:
            self.unread = None  # a body that can never complete is not handed to the app
        self.state = _DISCONNECTED
        self._wake_receive()
        self.resume_sending()

    def resume_sending(self) -> None:
        """The transport's buffer drained (or the client is gone): a waiting send() goes on."""
        waiter = self.send_waiter
        if waiter is not None:
            self.send_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def close_after(self) -> None:
        """Close the connection after this response ("Connection: close" if not framed yet)."""
        self.response.keep_alive = False

    @property
    def backlogged(self) -> bool:
        """More unread body than HIGH_WATER: the connection must not read on."""
        return self.buffered > HIGH_WATER and self.unread is not None

    @property
    def response_started(self) -> bool:
        return self.response.started

    def flush_head(self) -> None:
        head = self.response.take_head()
        if head and self.state is not _DISCONNECTED:
            self.channel.write(head)

    def _wake_receive(self) -> None:
        waiter = self.receive_waiter
        if waiter is not None:
            self.receive_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # The app side ----------------------------------------------------------------------------

    async def run(self, app: Any, scope: dict[str, Any]) -> None:
        """Call the app; whatever happens, the connection hears of the end exactly once."""
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            self.failed(exc)
        else:
            if not self.response.complete:
                self.incomplete()

    async def receive(self) -> dict[str, Any]:
        while True:
            unread = self.unread
            state = self.state
            if unread:
                data = unread[0] if len(unread) == 1 else b"".join(unread)
                unread.clear()
                backlog = self.buffered > HIGH_WATER
                self.buffered = 0
                more = state is _RECEIVING_BODY or state is _STREAMING
                if not more:
                    self.unread = None
                if backlog:
                    self.channel.body_taken()
                return {"type": "http.request", "body": data, "more_body": more}
            if unread is not None and state is not _RECEIVING_BODY and state is not _STREAMING:
                self.unread = None
                return {"type": "http.request", "body": b"", "more_body": False}
            if state is _RESPONSE_DONE or state is _DISCONNECTED:
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
        if state is _RECEIVING_BODY and self.continue_owed:
            # The client is still waiting for our go-ahead: it may or may not send the body.
            response.keep_alive = False
        data = response.feed(message)
        if state is _RECEIVING_BODY:
            self.state = _STREAMING
        elif state is _BODY_DONE:
            self.state = _RESPONSE_STARTED
        writable = True
        if data:
            writable = self.channel.write(data)
        elif response.head_pending:
            # Just started: the head rides with the first body message if that comes in this
            # task step; otherwise (a slow stream) it goes out on its own right after.
            self.channel.hold_head(self)
        if response.complete:
            self._finish(response.will_keep_alive)
        elif not writable:
            waiter = self.send_waiter = self.loop.create_future()
            await self._wait_on_client(waiter)  # backpressure: the transport is over its high-water mark
            if self.state is _DISCONNECTED:
                raise ClientDisconnected("client disconnected")

    async def _wait_on_client(self, waiter: asyncio.Future[None]) -> None:
        channel = self.channel
        channel.client_wait(self, True)
        try:
            await waiter
        finally:
            channel.client_wait(self, False)

    # Endings ---------------------------------------------------------------------------------

    def _finish(self, keep_alive: bool) -> None:
        self.state = _RESPONSE_DONE
        self.unread = None
        if self.receive_waiter is not None:
            self._wake_receive()
        self.channel.cycle_done(self, keep_alive)

    def failed(self, exc: BaseException) -> None:
        if self.state is _RESPONSE_DONE:
            log.error("Exception in ASGI application after the response was sent", exc_info=exc)
            return
        if self.state is _DISCONNECTED or isinstance(exc, (ClientDisconnected, asyncio.CancelledError)):
            log.debug("ASGI app ended after the client disconnected: %r", exc)
        else:
            log.error("Exception in ASGI application", exc_info=exc)
        self.abort_response()

    def incomplete(self) -> None:
        if self.state is not _DISCONNECTED:
            if self.response.started:
                log.error("ASGI app returned without completing the response")
            else:
                log.error("ASGI app returned without starting a response")
        self.abort_response()

    def abort_response(self) -> None:
        """500 if nothing was sent yet, else cut the connection (the client sees a short body)."""
        if self.state is _RESPONSE_DONE:
            return
        if self.state is not _DISCONNECTED and not self.response.started:
            self.channel.write(simple_response(500, b"Internal Server Error"))
            self.response.status = 500
        self._finish(False)


# ---------------------------------------------------------------------------------------------
# Lifespan


class Lifespan:
    """Drive the app's ``lifespan`` scope: startup before serving, shutdown at graceful stop.

    An app that raises on the lifespan scope before its first ``receive()`` does not implement
    it: logged at debug, serving goes on. Raising after receiving ``lifespan.startup`` without
    answering is a startup failure. ``state`` is the dict every request scope copies.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self.supported = True
        self._task: asyncio.Task[None] | None = None
        self._inbox: list[dict[str, Any]] = []
        self._inbox_ready: asyncio.Future[None] | None = None
        self._reply: asyncio.Future[dict[str, Any]] | None = None
        self._received = False
        self._phase = "startup"

    async def startup(self) -> None:
        """Run lifespan.startup; raise LifespanFailure if the app reports or raises a failure."""
        loop = asyncio.get_running_loop()
        scope = {"type": "lifespan", "asgi": ASGI_INFO, "state": self.state}
        self._task = loop.create_task(self._run(scope))
        message = await self._exchange("startup")
        if message is None:
            return
        if message["type"] == "lifespan.startup.failed":
            raise LifespanFailure(f"ASGI lifespan startup failed: {message.get('message', '')}")
        if message["type"] != "lifespan.startup.complete":
            raise LifespanFailure(f"unexpected lifespan message during startup: {message['type']!r}")

    async def shutdown(self) -> None:
        """Run lifespan.shutdown if startup completed; failures are logged, never raised."""
        if not self.supported or self._task is None or self._task.done():
            return
        message = await self._exchange("shutdown")
        if message is not None and message["type"] == "lifespan.shutdown.failed":
            log.error("ASGI lifespan shutdown failed: %s", message.get("message", ""))

    async def _exchange(self, phase: str) -> dict[str, Any] | None:
        """Deliver lifespan.<phase>; return the app's answer, or None if it does not do lifespan."""
        assert self._task is not None
        self._phase = phase
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._reply = reply
        self._inbox.append({"type": f"lifespan.{phase}"})
        if self._inbox_ready is not None and not self._inbox_ready.done():
            self._inbox_ready.set_result(None)
        pending: set[asyncio.Future[Any]] = {reply, self._task}
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if reply.done():
            return reply.result()
        reply.cancel()
        if self.supported:
            log.warning("ASGI lifespan task returned without answering lifespan.%s", phase)
        return None

    async def _run(self, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, self._receive, self._send)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            if not self._received:
                self.supported = False
                log.debug("ASGI app does not support lifespan (%s: %s)", type(exc).__name__, exc)
                return
            reply = self._reply
            if reply is None or reply.done():
                log.error("Exception in ASGI lifespan task", exc_info=exc)
                return
            log.error("Exception in ASGI lifespan %s", self._phase, exc_info=exc)
            detail = f"{type(exc).__name__}: {exc}"
            reply.set_result({"type": f"lifespan.{self._phase}.failed", "message": detail})
        else:
            if not self._received:
                self.supported = False  # returned without looking: no lifespan support

    async def _receive(self) -> dict[str, Any]:
        self._received = True
        while not self._inbox:
            self._inbox_ready = asyncio.get_running_loop().create_future()
            await self._inbox_ready
        return self._inbox.pop(0)

    async def _send(self, message: dict[str, Any]) -> None:
        reply = self._reply
        if reply is not None and not reply.done():
            reply.set_result(message)


# ---------------------------------------------------------------------------------------------
# Warm-up


def warmup_asgi(app: Any, requests: list[Request], config: Config) -> list[int]:
    """Run each request through the app, without a socket, on a throwaway event loop.

    Runs in the mold before it forks: the loop is plain asyncio (no uvloop state to inherit) and
    is closed completely, default executor included, so no thread survives. Lifespan is not run
    (its resources must be opened in each worker). Returns the statuses; 500 if the app raised.
    """
    loop = asyncio.new_event_loop()
    try:
        statuses = [loop.run_until_complete(_warm_one(app, request, config)) for request in requests]
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
    return statuses


async def _warm_one(app: Any, request: Request, config: Config) -> int:
    scope = build_scope(
        request, server=("localhost", 80), client=("127.0.0.1", 0), root_path=config.root_path, state={}
    )
    response = ResponseState(request, keep_alive=False)
    sent_request = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        response.feed(message)

    try:
        await app(scope, receive, send)
    except Exception:
        log.warning("warm-up request %s raised", request.target.decode("utf-8", "replace"), exc_info=True)
        return 500
    return response.status if response.complete else 500
