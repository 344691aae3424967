"""The ``send()`` messages of one ASGI response, validated and framed into bytes (sans-IO)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from refork.http.events import Request
from refork.http.response import ResponseFramer


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
