"""One HTTP/2 stream on the ASGI loop: the receive() and send() its app task sees.

The connection (:class:`refork.serving.asgi.http2_protocol.Http2Protocol`) drives it (body pieces, end of
body, reset, window opened) and it answers through the connection's :class:`Http2Connection`.
Backpressure is HTTP/2's own: the request body's window reopens only as the app reads, and
send() waits while the client's window for the stream is shut (the rest of the connection goes
on), or while the transport is over its high-water mark.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Any

from refork.asgi.cycle import ClientDisconnected
from refork.asgi.files import file_source
from refork.asgi.response import EARLY_HINT, early_hint_links
from refork.asgi.waiting import wake
from refork.http.events import Request
from refork.http.h2 import ErrorCodes

if TYPE_CHECKING:
    from refork.serving.asgi.roles import StreamOwner

log = logging.getLogger("refork")

_ERROR_BODY = b"Internal Server Error"
_FILE_CHUNK = 1 << 16


class Stream:
    """One request/response exchange on an HTTP/2 connection."""

    __slots__ = (
        "conn", "sid", "request", "unread", "body_done", "gone", "started", "status", "headers",
        "trailers", "complete", "body_bytes", "receive_waiter", "send_waiter", "task", "token",
        "started_at", "remote", "hook_request", "delivered_end", "head_out", "opened_at", "received",
        "window_wait_since",
    )  # fmt: skip

    def __init__(self, conn: StreamOwner[Stream], sid: int, request: Request, body_done: bool) -> None:
        self.conn = conn
        self.sid = sid
        self.request = request
        self.unread: list[bytes] = []
        self.body_done = body_done
        self.delivered_end = False
        self.gone = False  # RST_STREAM, GOAWAY or the connection lost
        self.started = False  # http.response.start received
        self.head_out = False  # the response head went out
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.trailers = False  # the app said it sends http.response.trailers
        self.complete = False
        self.body_bytes = 0
        self.receive_waiter: asyncio.Future[None] | None = None
        self.send_waiter: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.token: object = None
        self.started_at = 0.0
        self.remote: str | None = None
        self.hook_request: Any = None
        self.opened_at = conn.loop.time()  # the body deadline runs from the head
        self.received = 0  # body bytes: each --body-min-rate of them extends the deadline
        self.window_wait_since = 0.0  # send() waits for the client's window (the write timeout)

    # Driven by the connection ----------------------------------------------------------------

    def body_received(self, data: bytes) -> None:
        self.received += len(data)
        self.unread.append(data)
        self.conn.hold_body(len(data))
        self._wake_receive()

    def end_received(self) -> None:
        self.body_done = True
        self._wake_receive()

    def reset(self) -> None:
        """The client reset the stream (or the connection went): receive() says http.disconnect."""
        self.gone = True
        self.let_go()
        self._wake_receive()
        self.window_opened()

    def let_go(self) -> None:
        """The unread body is taken or dropped: its bytes leave the worker's --max-request-memory."""
        held = sum(len(piece) for piece in self.unread)
        self.unread.clear()
        if held:
            self.conn.release(held)

    def window_opened(self) -> None:
        waiter, self.send_waiter = self.send_waiter, None
        wake(waiter)

    def _wake_receive(self) -> None:
        waiter, self.receive_waiter = self.receive_waiter, None
        wake(waiter)

    # The app side ----------------------------------------------------------------------------

    async def run(self, app: Any, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self.receive, self.send)
        except BaseException as exc:
            if isinstance(exc, (SystemExit, KeyboardInterrupt)):
                raise
            if self.gone or isinstance(exc, (ClientDisconnected, asyncio.CancelledError)):
                log.debug("ASGI app ended after the client reset its stream: %r", exc)
            else:
                log.error("Exception in ASGI application", exc_info=exc)
            self._abort()
        else:
            if not self.complete:
                if not self.gone:
                    what = "completing" if self.started else "starting"
                    log.error("ASGI app returned without %s the response", what)
                self._abort()
        finally:
            self.conn.stream_done(self)

    async def receive(self) -> dict[str, Any]:
        while True:
            if self.unread:
                data = self.unread[0] if len(self.unread) == 1 else b"".join(self.unread)
                self.let_go()
                self.conn.body_consumed(self, len(data))
                more = not self.body_done
                self.delivered_end = not more
                return {"type": "http.request", "body": data, "more_body": more}
            if self.gone:
                return {"type": "http.disconnect"}
            if self.body_done and not self.delivered_end:
                self.delivered_end = True
                return {"type": "http.request", "body": b"", "more_body": False}
            waiter = self.receive_waiter = self.conn.loop.create_future()
            if self.body_done:
                await waiter  # the body is done: only a reset can wake this
            else:
                await self.conn.wait_on_client(self, waiter)

    async def send(self, message: dict[str, Any]) -> None:
        if self.gone:
            raise ClientDisconnected("client reset the stream")
        kind = message.get("type")
        if kind == "http.response.start":
            if self.started:
                raise RuntimeError("ASGI app sent http.response.start twice")
            status = message.get("status")
            if not isinstance(status, int) or not 100 <= status <= 999:
                raise TypeError(f"http.response.start: status must be an int from 100 to 999, got {status!r}")
            if status < 200:  # interim (RFC 9110 15.2): the app's bug is a 500 on this stream
                raise RuntimeError(f"Informational status {status} cannot be sent as the final response")
            headers = [(bytes(n), bytes(v)) for n, v in message.get("headers", ())]
            self.started, self.status, self.headers = True, status, headers
            self.trailers = bool(message.get("trailers", False))
            return
        if kind == EARLY_HINT:  # before the head (at any time until then), else dropped
            links = early_hint_links(message)
            if not self.head_out:
                self.conn.send_hints(self, links)
            return
        if not self.started:
            raise RuntimeError(f"ASGI app sent {kind!r} before http.response.start")
        if self.complete:
            raise RuntimeError(f"ASGI app sent {kind!r} after the response was complete")
        if kind == "http.response.body":
            body = message.get("body", b"")
            more = bool(message.get("more_body", False))
            await self._write(bytes(body), end=not more and not self.trailers)
            if not more and not self.trailers:
                self.complete = True
        elif kind == "http.response.trailers":
            if not self.trailers:
                raise RuntimeError("http.response.trailers without trailers=True in http.response.start")
            await self._write(b"", end=False)
            if not message.get("more_trailers", False):
                self.conn.send_trailers(self, [(bytes(n), bytes(v)) for n, v in message.get("headers", ())])
                self.complete = True
        elif kind in ("http.response.pathsend", "http.response.zerocopysend"):
            await self._send_file(message)
        else:
            raise RuntimeError(f"unknown ASGI message type {kind!r} on an http connection")

    async def _send_file(self, message: dict[str, Any]) -> None:
        source = file_source(message)
        try:
            left, offset = source.count, source.offset
            while left > 0:
                chunk = os.pread(source.fd, min(left, _FILE_CHUNK), offset)
                if not chunk:
                    raise RuntimeError(f"the file ended {left} bytes early")
                left -= len(chunk)
                offset += len(chunk)
                end = left == 0 and not source.more_body and not self.trailers
                await self._write(chunk, end=end)
            if not source.more_body and not self.trailers:
                if source.count == 0:
                    await self._write(b"", end=True)
                self.complete = True
            source.done()
        finally:
            source.close()

    async def _write(self, body: bytes, end: bool) -> None:
        """The head if not sent yet, then ``body`` as the client's window allows."""
        conn = self.conn
        if self.request.method == "HEAD":
            body = b""
        if not self.head_out:
            self.head_out = True
            conn.send_head(self, end_stream=end and not body)
            if end and not body:
                return
        view = memoryview(body)
        self.body_bytes += len(body)
        while True:
            sent = conn.send_body(self, view, end)
            view = view[sent:]
            if not view:
                break
            self.window_wait_since = conn.loop.time()
            try:
                await self._wait(conn)  # the client's window for this stream (or the connection) is shut
            finally:
                self.window_wait_since = 0.0
        if conn.write_blocked_since:
            await self._wait(conn)  # the transport is over its high-water mark

    async def _wait(self, conn: StreamOwner[Stream]) -> None:
        waiter = self.send_waiter = conn.loop.create_future()
        await conn.wait_on_client(self, waiter)
        if self.gone:
            raise ClientDisconnected("client reset the stream")

    def _abort(self) -> None:
        """500 if nothing went out yet, else RST_STREAM INTERNAL_ERROR (the client sees it cut)."""
        if self.complete or self.gone:
            self.complete = True
            return
        conn = self.conn
        if not self.head_out:
            self.head_out = True
            self.status, self.headers = 500, [(b"content-type", b"text/plain; charset=utf-8"),
                                              (b"content-length", b"%d" % len(_ERROR_BODY))]  # fmt: skip
            conn.send_head(self, end_stream=False)
            self.body_bytes = len(_ERROR_BODY)
            conn.send_body(self, memoryview(_ERROR_BODY), True)
        else:
            conn.reset_stream(self, ErrorCodes.INTERNAL_ERROR)
        self.complete = True
