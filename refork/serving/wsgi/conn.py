"""What the WSGI loop (refork.serving.wsgi.python_loop) keeps per client connection.

A Conn is one socket with its parser, the request being received and its place in the
connection contract (refork.serving.connection: phase and since); a Writing is a response waiting
for its client to read (threads == 1). Slotted records: a Conn reads its own PROXY header and
charges what its parser holds, the request path does the rest. LoopParts: the kind of Conn the
loop makes, and what else it serves with (pure Python, or refork._native's).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

from refork.http.body import BodyBuffer, InputStream
from refork.http.budget import MemoryBudget, charge_parser
from refork.http.events import Event, ParseError, Request
from refork.http.parser import Limits, RequestParser
from refork.http.proxy_protocol import INCOMPLETE, ProxyHeader, ProxyPolicy
from refork.serving.connection import Phase
from refork.serving.outbox import Outbox
from refork.serving.proxied import CLOSED, peer_host, read_preface
from refork.serving.tls_io import TlsConn
from refork.wsgi import EnvironBuilder, Outcome, Streaming, start_wsgi

__all__ = ["NO_EVENTS", "PYTHON", "Conn", "Http2Session", "Job", "LoopParts", "Step", "Writing"]

# What a read gives the loop: parser events, and last, if the bytes turned bad, the ParseError to
# answer once the requests before it are answered.
Step = Event | ParseError
NO_EVENTS: Sequence[Step] = ()  # nothing pipelined behind a request (shared: never mutated)


class Http2Session(Protocol):
    """A connection's HTTP/2 session (refork.serving.wsgi.http2.Session), as the loop drives it."""

    def on_ready(self) -> None: ...

    def sweep(self, now: float, draining: bool, drain_until: float) -> None: ...

    def stop(self) -> None: ...

    def lost(self) -> None: ...

    def answer_timed_out(self) -> None: ...


class Conn:
    """One client connection: its socket, parser and the request being received."""

    __slots__ = (
        "sock", "fd", "client", "builder", "parser", "request", "body", "received",
        "phase", "since", "fresh", "continued", "registered", "busy", "closed", "out", "writing", "tls",
        "held", "preface", "sniffed", "h2",
    )  # fmt: skip

    def __init__(self, sock: socket.socket, client: Any, builder: EnvironBuilder, limits: Limits,
                 out: Outbox, tls: TlsConn | None = None) -> None:  # fmt: skip
        self.sock = sock
        self.fd = sock.fileno()
        self.client = client
        self.builder = builder
        self.parser = RequestParser(limits)
        self.request: Request | None = None  # head received, body still coming
        self.body: BodyBuffer | None = None
        self.received = 0  # body bytes of the current request (each --body-min-rate: one more second)
        self.phase = Phase.IDLE  # what the sweep judges: see refork.serving.connection
        self.since = 0.0  # when the connection entered that phase
        self.fresh = True  # no byte received yet (see Timeouts.expiry)
        self.continued = False  # "100 Continue" already sent for the current request
        self.registered = False
        self.busy = False  # dispatched to a pool thread
        self.closed = False
        self.out = out
        self.writing: Writing | None = None  # a response waiting for the client to read (threads == 1)
        self.tls = tls  # the TLS side (handshake, reads) on a TLS listener; None: plain
        self.held = 0  # what its parser holds, charged to the worker's --max-request-memory
        self.preface: bytes | None = None  # a PROXY header's bytes read so far; None: none expected
        self.sniffed: bytes | None = None  # h2c: the first bytes while they may be the HTTP/2 preface
        self.h2: Http2Session | None = None  # an HTTP/2 connection (refork.serving.wsgi.http2)

    def read_proxy_header(self, policy: ProxyPolicy) -> bool | None:
        """The PROXY header at the start of the connection (refork.serving.proxied): True once it
        is read (or there is none) and the connection's own bytes may be read, its client then the
        connection's; False: wait for more; None: the client closed. A refused one: ProxyError."""
        assert self.preface is not None
        try:
            verdict, self.preface = read_preface(self.sock, self.preface, policy, peer_host(self.client))
        except (BlockingIOError, InterruptedError):
            return False
        if verdict is INCOMPLETE:
            self.fresh = False
            if self.phase is not Phase.HEAD:  # the header timeout bounds it, as a request head's
                self.phase = Phase.HEAD
                self.since = time.monotonic()
            return False
        if verdict is CLOSED:
            return None
        self.preface = None
        if isinstance(verdict, ProxyHeader):
            self.fresh = False
            self.phase = Phase.IDLE
            self.since = time.monotonic()
            if verdict.client is not None:
                self.client = self.out.client = verdict.client
        return True

    def hold(self, memory: Any) -> ParseError | None:
        """Charge what the parser holds now to the worker's --max-request-memory (`memory`); a
        head that does not fit is refused (503: the server is short of room now, not the request
        too big), other bytes (kept for a replay) are charged all the same."""
        parser = self.parser
        held = parser.buffered if parser.in_message else 0
        refused = charge_parser(memory, self.held, held, parser.head_held)
        if refused is None:
            self.held = held
        return refused

    def has_input(self) -> bool:
        """Bytes (or a FIN) wait to be read: the sweep spares a connection the loop has not
        served yet."""
        if self.tls is not None:
            return self.tls.has_input()
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK))
        except OSError:
            return False


class Writing:
    """A response waiting for its client to read (threads == 1): what to finish when it is out."""

    __slots__ = ("streaming", "request", "environ", "stream", "token", "started", "rest")

    def __init__(self, streaming: Streaming, request: Request, environ: dict[str, Any], stream: InputStream,
                 token: object, started: float, rest: Sequence[Step]) -> None:  # fmt: skip
        self.streaming = streaming
        self.request = request
        self.environ = environ
        self.stream = stream
        self.token = token
        self.started = started
        self.rest = rest  # pipelined events parsed after this request: handled once it is written


Job = tuple[Conn, Request, InputStream, "Sequence[Step]"]  # a complete request for a pool thread


class LoopParts(NamedTuple):
    """What the Python loop parses, builds environs, frames and budgets memory with: pure Python
    (:data:`PYTHON`), or refork._native's (refork.serving.wsgi.native_parts.NATIVE)."""

    conn_type: type[Conn]
    start_wsgi: Callable[..., Outcome | Streaming]
    builder: Callable[[EnvironBuilder], EnvironBuilder]  # a listener's EnvironBuilder, as used
    memory: Callable[[int], Any]  # the worker's budget of request bytes held (--max-request-memory)


PYTHON = LoopParts(Conn, start_wsgi, lambda builder: builder, MemoryBudget)
