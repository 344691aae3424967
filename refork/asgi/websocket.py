"""The ASGI ``websocket`` scope and the app side of one WebSocket (sans-IO: no socket, no wsproto).

:func:`build_websocket_scope` turns a handshake request into the scope. :class:`WebSocketSession`
is the app-facing receive()/send() pair with one explicit :class:`WebSocketState`; the connection
(refork.serving.asgi.websocket_protocol) drives it (messages in, the peer gone, writable again) and it
answers only through its :class:`WebSocketChannel`, which speaks the wire protocol.

What the app may send, and when (anything else is a RuntimeError naming what was expected, as
uvicorn does):

==============  ==================================================================================
CONNECTING      ``websocket.accept`` (subprotocol, extra headers); ``websocket.close`` (HTTP 403,
                the handshake is refused); ``websocket.http.response.start`` (the denial
                response extension: any status and headers, then its body)
DENYING         ``websocket.http.response.body`` until ``more_body`` is false
CONNECTED       ``websocket.send`` (exactly one of ``bytes``/``text``), ``websocket.close``
CLOSED          nothing (the app closed, or its denial response is complete)
DISCONNECTED    the peer is gone: ``websocket.send`` raises :class:`ClientDisconnected` (an OSError,
                as the spec asks); a ``websocket.close`` is a no-op
==============  ==================================================================================

An app that returns before accepting gets the 403 a ``websocket.close`` would have sent; one that
raises before accepting gets a 500 (an app error, which alerts on 5xx should see), logged with its
traceback. After the handshake, an app that returns closes the WebSocket with 1000, one that raises
with 1011 (internal error).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from typing import Any, Protocol

from refork.asgi.cycle import ClientDisconnected
from refork.asgi.response import ResponseState
from refork.asgi.scope import build_scope
from refork.asgi.waiting import wake
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies
from refork.http.response import simple_response

log = logging.getLogger("refork")

WEBSOCKET_ASGI = {"version": "3.0", "spec_version": "2.4"}  # what uvicorn advertises
DENIAL_EXTENSION = "websocket.http.response"
ABNORMAL_CLOSURE = 1006  # RFC 6455 7.1.5: the connection closed without a close frame
INTERNAL_ERROR = 1011
MAX_REASON = 123  # bytes of UTF-8: a close frame's payload is at most 125, 2 of them the code


class WebSocketState(enum.Enum):
    """Where one WebSocket is, as its app sees it."""

    CONNECTING = "connecting"  # the handshake waits for the app's accept / close / denial
    DENYING = "denying"  # a denial response (websocket.http.response.*) is being sent
    CONNECTED = "connected"  # accepted: messages both ways
    CLOSED = "closed"  # the app closed (or denied): it may still receive the disconnect
    DISCONNECTED = "disconnected"  # the peer closed, or the connection is gone


_CONNECTING = WebSocketState.CONNECTING
_DENYING = WebSocketState.DENYING
_CONNECTED = WebSocketState.CONNECTED
_CLOSED = WebSocketState.CLOSED
_DISCONNECTED = WebSocketState.DISCONNECTED


class WebSocketChannel(Protocol):
    """The one way a :class:`WebSocketSession` reaches its connection (serving.asgi.websocket_protocol)."""

    def accept(self, subprotocol: str | None, headers: list[tuple[bytes, bytes]]) -> None:
        """Complete the handshake (101) and start exchanging frames."""

    def respond(self, data: bytes, done: bool) -> None:
        """Write HTTP response bytes instead of the handshake (403, 500, a denial); close when done."""

    def send_message(self, data: str | bytes) -> bool:
        """Send one message; False: over the write limit, wait for resume_sending()."""

    def close(self, code: int, reason: str) -> None:
        """Start the closing handshake with this code and reason."""

    def message_taken(self, queued: int, size: int) -> None:
        """receive() took a message of `size` bytes; `queued` are left: reading may resume."""


def subprotocols(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """The subprotocols a handshake offers (``Sec-WebSocket-Protocol``, in order)."""
    offered: list[str] = []
    for name, value in headers:
        if name == b"sec-websocket-protocol":
            offered.extend(p.strip() for p in value.decode("latin-1").split(",") if p.strip())
    return offered


def build_websocket_scope(
    request: Request,
    *,
    server: tuple[str, int | None] | None,
    client: tuple[str, int] | None,
    scheme: str = "http",
    root_path: str = "",
    proxies: TrustedProxies | None = None,
    state: dict[str, Any] | None = None,
    tls: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``websocket`` scope of a handshake request (the http scope's rules for path, root_path,
    trusted proxies and state; ``ws``/``wss`` for the scheme; the denial extension advertised, and
    the ``tls`` one on a TLS connection)."""
    scope = build_scope(
        request,
        server=server,
        client=client,
        scheme=scheme,
        root_path=root_path,
        proxies=proxies,
        state=state,
    )
    scope["type"] = "websocket"
    scope["asgi"] = WEBSOCKET_ASGI.copy()  # each its own: an app may write to its scope
    del scope["method"]
    scope["scheme"] = "wss" if scope["scheme"] in ("https", "wss") else "ws"
    scope["subprotocols"] = subprotocols(request.headers)
    scope["extensions"] = {DENIAL_EXTENSION: {}}
    if tls is not None:
        scope["extensions"]["tls"] = tls.copy()
    return scope


class WebSocketSession:
    """One WebSocket's receive() and send(), its :class:`WebSocketState` and its incoming queue.

    ``status`` is what the access log shows: 101 once accepted, else the refusal's status.
    ``sent`` and ``received`` count message payload bytes; ``queued_bytes`` those of the messages
    waiting for receive() (bytes of UTF-8 for text).
    """

    __slots__ = (
        "channel", "loop", "request", "state", "queue", "sizes", "queued_bytes", "connect_sent",
        "receive_waiter", "send_waiter", "status", "sent", "received", "response", "disconnect",
    )  # fmt: skip

    def __init__(self, channel: WebSocketChannel, loop: asyncio.AbstractEventLoop, request: Request) -> None:
        self.channel = channel
        self.loop = loop
        self.request = request
        self.state = _CONNECTING
        self.queue: deque[dict[str, Any]] = deque()
        self.sizes: deque[int] = deque()  # the size of each queued message
        self.queued_bytes = 0
        self.connect_sent = False
        self.receive_waiter: asyncio.Future[None] | None = None
        self.send_waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.sent = 0
        self.received = 0
        self.response: ResponseState | None = None
        self.disconnect: dict[str, Any] | None = None  # queued once the peer is gone

    # Driven by the connection ----------------------------------------------------------------

    def message_received(self, data: str | bytes, size: int = -1) -> int:
        """A complete message from the peer, of `size` bytes (of UTF-8 for text; -1: count them);
        returns how many wait for receive() now."""
        if type(data) is str:
            self.queue.append({"type": "websocket.receive", "text": data})
            if size < 0:
                size = len(data.encode())
        else:
            self.queue.append({"type": "websocket.receive", "bytes": data})
            if size < 0:
                size = len(data)
        self.sizes.append(size)
        self.queued_bytes += size
        self.received += len(data)
        self._wake(False)
        return len(self.queue)

    def drop_queue(self) -> int:
        """Forget the messages no receive() will take now (the app is done); their bytes."""
        dropped = self.queued_bytes
        self.queue.clear()
        self.sizes.clear()
        self.queued_bytes = 0
        return dropped

    def disconnected(self, code: int, reason: str = "") -> None:
        """The peer closed (its close frame's code), the server closed it, or the connection is
        gone (1006). receive() hands out what was queued first, then the disconnect."""
        if self.disconnect is not None:
            return
        self.disconnect = {"type": "websocket.disconnect", "code": code, "reason": reason}
        self.state = _DISCONNECTED
        self._wake(False)
        self._wake(True)

    def resume_sending(self) -> None:
        """The connection's write buffer drained (or it closed): a waiting send() goes on."""
        self._wake(True)

    def _wake(self, sending: bool) -> None:
        if sending:
            waiter, self.send_waiter = self.send_waiter, None
        else:
            waiter, self.receive_waiter = self.receive_waiter, None
        wake(waiter)

    @property
    def accepted(self) -> bool:
        return self.status == 101

    # The app side ----------------------------------------------------------------------------

    async def run(self, app: Any, scope: dict[str, Any]) -> None:
        """Call the app; whatever it does, the handshake is answered and the WebSocket closed."""
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            self.failed(exc)
        else:
            self.returned()

    async def receive(self) -> dict[str, Any]:
        if not self.connect_sent:
            self.connect_sent = True
            return {"type": "websocket.connect"}
        while True:
            queue = self.queue
            if queue:
                message = queue.popleft()
                size = self.sizes.popleft()
                self.queued_bytes -= size
                self.channel.message_taken(len(queue), size)
                return message
            if self.disconnect is not None:
                return self.disconnect
            waiter = self.receive_waiter = self.loop.create_future()
            await waiter

    async def send(self, message: dict[str, Any]) -> None:
        try:
            kind = message["type"]
        except (KeyError, TypeError):
            raise RuntimeError(f"ASGI message must be a dict with a 'type' key, got {message!r}") from None
        state = self.state
        if state is _CONNECTED:
            if kind == "websocket.send":
                await self._send_message(message)
            elif kind == "websocket.close":
                code, reason = _close_args(message)
                self.state = _CLOSED
                self.channel.close(code, reason)
            else:
                raise RuntimeError(
                    f"Expected ASGI message 'websocket.send' or 'websocket.close', but got {kind!r}"
                )
        elif state is _CONNECTING:
            if kind == "websocket.accept":
                self._accept(message)
            elif kind == "websocket.close":
                _close_args(message)  # checked all the same: the app's bug shows before it ships
                self.refuse(403)
            elif kind == "websocket.http.response.start":
                self._deny(message)
            else:
                raise RuntimeError(
                    "Expected ASGI message 'websocket.accept', 'websocket.close' or "
                    f"'websocket.http.response.start', but got {kind!r}"
                )
        elif state is _DENYING:
            if kind != "websocket.http.response.body":
                raise RuntimeError(f"Expected ASGI message 'websocket.http.response.body', but got {kind!r}")
            response = self.response
            assert response is not None
            data = response.feed({**message, "type": "http.response.body"})
            if response.complete:
                self.state = _CLOSED
            self.channel.respond(data, response.complete)
        elif state is _CLOSED:
            raise RuntimeError(
                f"Unexpected ASGI message {kind!r} after sending 'websocket.close' or a complete response"
            )
        else:  # DISCONNECTED
            if kind == "websocket.close":
                return  # closing what the peer closed already: nothing to do, nothing wrong
            if kind not in _ALL:
                raise RuntimeError(f"Unexpected ASGI message {kind!r} on a WebSocket")
            raise ClientDisconnected("client disconnected")

    def _accept(self, message: dict[str, Any]) -> None:
        subprotocol = message.get("subprotocol")
        if subprotocol is not None and not isinstance(subprotocol, str):
            raise RuntimeError(f"'subprotocol' must be a str or None, got {subprotocol!r}")
        headers = _headers(message.get("headers", ()))
        for name, _ in headers:
            if name.lower() in _HANDSHAKE_HEADERS:
                raise RuntimeError(f"{name!r} is set by the server; use 'subprotocol' for the subprotocol")
        self.state = _CONNECTED
        self.status = 101
        self.channel.accept(subprotocol, headers)

    def _deny(self, message: dict[str, Any]) -> None:
        response = self.response = ResponseState(self.request, keep_alive=False)
        data = response.feed({**message, "type": "http.response.start"})
        self.state = _DENYING
        self.status = response.status
        if data:
            self.channel.respond(data, False)

    async def _send_message(self, message: dict[str, Any]) -> None:
        data = message.get("bytes")
        text = message.get("text")
        if (data is None) == (text is None):
            raise RuntimeError("'websocket.send' needs exactly one of 'bytes' and 'text' (the other None)")
        if data is not None:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise RuntimeError(f"'bytes' must be bytes, got {type(data).__name__}")
            payload: str | bytes = bytes(data) if type(data) is not bytes else data
        elif type(text) is str:
            payload = text
        else:
            raise RuntimeError(f"'text' must be a str, got {type(text).__name__}")
        self.sent += len(payload)
        if not self.channel.send_message(payload):
            waiter = self.send_waiter = self.loop.create_future()
            await waiter  # over --ws-write-limit: until the peer reads (the write timeout bounds it)
            if self.state is _DISCONNECTED:
                raise ClientDisconnected("client disconnected")

    def refuse(self, status: int) -> None:
        """Answer the handshake with a plain HTTP error (403: refused; 500: the app failed)."""
        self.state = _CLOSED
        self.status = status
        self.channel.respond(simple_response(status), True)

    # Endings ---------------------------------------------------------------------------------

    def returned(self) -> None:
        state = self.state
        if state is _CONNECTING:
            self.refuse(403)
        elif state is _CONNECTED:
            self.state = _CLOSED
            self.channel.close(1000, "")
        elif state is _DENYING:
            log.error("ASGI app returned without completing its WebSocket denial response")
            self.state = _CLOSED
            self.channel.respond(b"", True)

    def failed(self, exc: BaseException) -> None:
        state = self.state
        if state is _DISCONNECTED or isinstance(exc, (ClientDisconnected, asyncio.CancelledError)):
            log.debug("ASGI WebSocket app ended after the client disconnected: %r", exc)
        else:
            log.error("Exception in ASGI application (WebSocket)", exc_info=exc)
        if state is _CONNECTING:
            self.refuse(500)
        elif state is _CONNECTED:
            self.state = _CLOSED
            self.channel.close(INTERNAL_ERROR, "")
        elif state is _DENYING:
            self.state = _CLOSED
            self.channel.respond(b"", True)


_ALL = frozenset(
    ("websocket.accept", "websocket.send", "websocket.close", "websocket.http.response.start",
     "websocket.http.response.body")
)  # fmt: skip
_HANDSHAKE_HEADERS = frozenset(
    (
        b"sec-websocket-accept",
        b"sec-websocket-protocol",
        b"sec-websocket-extensions",
        b"upgrade",
        b"connection",
    )
)


def valid_close_code(code: int) -> bool:
    """A code an endpoint may send in a close frame (RFC 6455 7.4): not 1004-1006, 1015, or
    outside 1000-1014 / 3000-4999."""
    return 1000 <= code <= 1014 and code not in (1004, 1005, 1006) or 3000 <= code <= 4999


def _close_args(message: dict[str, Any]) -> tuple[int, str]:
    code = message.get("code", 1000)
    if code is None:
        code = 1000
    if type(code) is not int or not valid_close_code(code):
        raise RuntimeError(f"Invalid WebSocket close code {code!r} (1000-1014 but 1004-1006, or 3000-4999)")
    reason = message.get("reason") or ""
    if not isinstance(reason, str):
        raise RuntimeError(f"'reason' must be a str, got {type(reason).__name__}")
    if len(reason.encode("utf-8")) > MAX_REASON:
        raise RuntimeError(f"A close reason is at most {MAX_REASON} bytes of UTF-8")
    return code, reason


def _headers(headers: Any) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    try:
        for name, value in headers:
            if not isinstance(name, bytes) or not isinstance(value, bytes):
                raise RuntimeError(f"Header names and values must be bytes, got {(name, value)!r}")
            if b"\r" in name or b"\n" in name or b"\r" in value or b"\n" in value or b":" in name:
                raise RuntimeError(f"Invalid header {(name, value)!r}")
            out.append((name, value))
    except (TypeError, ValueError):
        raise RuntimeError(f"'headers' must be an iterable of [name, value] pairs, got {headers!r}") from None
    return out
