"""`GET /metrics` over HTTP/1.x, served inside the monitor's select loop without ever blocking it.

Non-blocking sockets only: the loop asks which sockets to wait on (`readers()`, `writers()`),
and hands back what became ready (`on_ready`). A scraper gets at most MAX_REQUEST bytes for its
request head and DEADLINE seconds for the whole exchange (read, render, write); past either it is
dropped. At most MAX_CLIENTS scrapers are served at once; one more is answered 503 (best effort,
non-blocking) and closed. Every answer closes the connection (Prometheus opens one per scrape
anyway), so there is no keep-alive state to keep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from refork.errors import ConfigError
from refork.process.listeners import bind, describe
from refork.process.metrics import CONTENT_TYPE

log = logging.getLogger("refork")
MAX_REQUEST = 8192  # bytes of request head
DEADLINE = 5.0  # seconds for one scrape, from accept to the last byte written
MAX_CLIENTS = 8  # scrapers served at once
BACKLOG = 64


@dataclass
class _Client:
    deadline: float
    inbox: bytes = b""
    outbox: bytes = b""  # the answer, once the request is in
    answered: bool = False


def _response(
    status: str, body: bytes, content_type: str = "text/plain; charset=utf-8", extra: str = ""
) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


BUSY = _response("503 Service Unavailable", b"too many scrapers at once\n", extra="Retry-After: 1\r\n")


class MetricsServer:
    """The monitor's metrics listener and its scrapers. `render()` is called once per GET /metrics."""

    def __init__(self, listener: socket.socket, render: Callable[[], str]) -> None:
        self.listener = listener
        self.render = render
        self.clients: dict[socket.socket, _Client] = {}
        self.address = describe(listener)

    @classmethod
    def open(cls, address: str, render: Callable[[], str]) -> MetricsServer:
        """Bind --metrics-bind (the same syntax as --bind); ConfigError saying so if it cannot be."""
        try:
            (listener,) = bind([address], BACKLOG)
        except ConfigError as e:
            raise ConfigError(f"--metrics-bind: {e}") from None
        return cls(listener, render)

    def readers(self) -> list[socket.socket]:
        return [self.listener, *(s for s, c in self.clients.items() if not c.answered)]

    def writers(self) -> list[socket.socket]:
        return [s for s, c in self.clients.items() if c.answered]

    def sockets(self) -> list[socket.socket]:
        """Every socket of ours, for a forked child to close."""
        return [self.listener, *self.clients]

    def on_ready(self, readable: list[socket.socket], writable: list[socket.socket], now: float) -> None:
        for sock in readable:
            if sock is self.listener:
                self._accept(now)
            elif sock in self.clients:
                self._read(sock)
        for sock in writable:
            if sock in self.clients:
                self._write(sock)
        for sock, client in list(self.clients.items()):
            if now > client.deadline:
                self._close(sock)

    def _accept(self, now: float) -> None:
        for _ in range(MAX_CLIENTS):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: try again on the next wake-up
                log.warning("metrics: accept failed: %s", e.strerror)
                return
            sock.setblocking(False)
            if len(self.clients) >= MAX_CLIENTS:
                with contextlib.suppress(OSError):
                    sock.send(BUSY)
                sock.close()
                continue
            self.clients[sock] = _Client(deadline=now + DEADLINE)

    def _read(self, sock: socket.socket) -> None:
        client = self.clients[sock]
        try:
            data = sock.recv(MAX_REQUEST + 1 - len(client.inbox))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(sock)
            return
        client.inbox += data
        end = client.inbox.find(b"\r\n\r\n")
        if end < 0:
            end = client.inbox.find(b"\n\n")
        if end >= 0:
            self._answer(sock, client, client.inbox[:end])
        elif len(client.inbox) > MAX_REQUEST:
            self._answer_with(sock, client, _response("431 Request Header Fields Too Large", b"too large\n"))

    def _answer(self, sock: socket.socket, client: _Client, head: bytes) -> None:
        parts = head.split(b"\n", 1)[0].strip().split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            self._answer_with(sock, client, _response("400 Bad Request", b"bad request\n"))
            return
        method, target = parts[0], parts[1]
        path = target.split(b"?", 1)[0]
        if path != b"/metrics":
            self._answer_with(sock, client, _response("404 Not Found", b"only /metrics here\n"))
        elif method not in (b"GET", b"HEAD"):
            answer = _response("405 Method Not Allowed", b"GET or HEAD\n", extra="Allow: GET, HEAD\r\n")
            self._answer_with(sock, client, answer)
        else:
            try:
                body = self.render().encode("utf-8")
            except Exception:
                log.exception("metrics: rendering failed")
                self._answer_with(sock, client, _response("500 Internal Server Error", b"see the log\n"))
                return
            answer = _response("200 OK", body, CONTENT_TYPE)
            if method == b"HEAD":
                answer = answer[: len(answer) - len(body)]
            self._answer_with(sock, client, answer)

    def _answer_with(self, sock: socket.socket, client: _Client, answer: bytes) -> None:
        client.answered = True
        client.inbox = b""
        client.outbox = answer
        self._write(sock)

    def _write(self, sock: socket.socket) -> None:
        client = self.clients[sock]
        try:
            sent = sock.send(client.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(sock)
            return
        client.outbox = client.outbox[sent:]
        if not client.outbox:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        self.clients.pop(sock, None)
        sock.close()

    def close(self) -> None:
        for sock in list(self.clients):
            self._close(sock)
        if self.listener.family == socket.AF_UNIX:
            with contextlib.suppress(OSError):
                os.unlink(self.listener.getsockname())
        self.listener.close()
