"""Events the HTTP/1.1 request parser emits: bytes go in, these come out (no sockets anywhere)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Request:
    """A complete, validated request head."""

    method: str  # "GET"
    target: bytes  # raw request-target, e.g. b"/a%20b?x=1"
    path: bytes  # raw (percent-encoded) path without the query
    query: bytes  # raw query string without the "?"
    http_version: str  # "1.1" or "1.0"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # names lower-cased
    keep_alive: bool = True  # what the client asked for (version + Connection header)
    expect_continue: bool = False  # "Expect: 100-continue" and a body is coming
    chunked: bool = False
    content_length: int | None = None
    # A WebSocket opening handshake (RFC 6455 4.1): GET, "Connection: upgrade", "Upgrade: websocket",
    # no body. Only a parser made with hand_off_websocket=True stops after it (RequestParser.upgraded).
    # (Not compared: a flag derived from the headers, not part of what the request says.)
    websocket: bool = field(default=False, compare=False)


@dataclass(slots=True)
class Body:
    """A piece of the request body, de-chunked."""

    data: bytes


@dataclass(slots=True)
class EndOfMessage:
    """The request (head and body) is complete."""


class ParseError(Exception):
    """The bytes are not an acceptable request: answer `status` and close the connection.

    ``events`` holds the complete requests parsed before the error in the same feed() (RFC 9112
    9.3.2: pipelined requests are answered in order, so a loop answers those first, then the
    error); raising loses them otherwise.
    """

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.events: list[Request | Body | EndOfMessage] = []


Event = Request | Body | EndOfMessage
