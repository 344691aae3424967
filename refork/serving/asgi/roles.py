"""What the ASGI loop's parts need of their owners, as Protocols, so that no import points back up.

:class:`refork.serving.asgi.server.Server` owns every connection and each connection calls back
into it (counters, budgets, the drain); an HTTP/1.1 connection hands over to HTTP/2, whose
streams answer through it. The lower modules name their owner by these roles only (type-only
imports included, no cycle), and the owner satisfies them structurally: mypy checks it where
the owner hands itself down.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Protocol, TypeVar

from refork.asgi import HttpCycle, Lifespan
from refork.config import Config
from refork.http.budget import MemoryBudget
from refork.http.forwarded import TrustedProxies
from refork.http.h2 import Http2Limits
from refork.http.parser import Limits
from refork.logs import AccessLog
from refork.serving.connection import Timeouts
from refork.serving.contract import WorkerControl
from refork.serving.health import HealthPaths
from refork.serving.request_hooks import RequestHooks


class Connection(Protocol):
    """What the server does with each of its connections (HTTP/1.1, HTTP/2, WebSocket)."""

    transport: Any  # the asyncio transport (uvloop's or the stdlib's)

    def stop(self) -> None: ...

    def sweep(self, now: float, timeouts: Timeouts, drain_until: float) -> None: ...


class Host(Protocol):
    """The per-worker state a connection reads and counts in, and the calls it makes back."""

    loop: asyncio.AbstractEventLoop
    app: Any  # the ASGI application
    config: Config
    control: WorkerControl
    limits: Limits
    proxies: TrustedProxies | None
    root_path: str
    lifespan: Lifespan
    access_log: AccessLog | None
    request_hooks: RequestHooks | None
    health: HealthPaths | None
    timeouts: Timeouts
    read_size: int
    connections: set[Connection]
    arriving: weakref.WeakSet[Connection]
    handshaking: weakref.WeakSet[Connection]
    h2_limits: Http2Limits
    h2_alpn: bool
    h2c: bool
    h1: bool
    ws_enabled: bool
    ws_memory: MemoryBudget
    ws_partial: int
    request_memory: MemoryBudget
    open_websockets: int
    in_flight: int
    stopping: bool
    serving: bool

    def hold_head(self, cycle: HttpCycle) -> None: ...

    def idle(self) -> None: ...

    def check_drained(self) -> None: ...


class Upgrading(Connection, Protocol):
    """The HTTP/1.1 connection handing its transport over to HTTP/2 (see http2_protocol.hand_over)."""

    srv: Host
    server_addr: tuple[str, int | None] | None
    client_addr: tuple[str, int] | None
    scheme: str
    tls: dict[str, Any] | None
    trusted: bool
    closing: bool

    def let_go(self) -> None: ...


S = TypeVar("S", contravariant=True)  # the stream type the HTTP/2 connection answers for


class StreamOwner(Protocol[S]):
    """The HTTP/2 connection as its streams see it: where they send, and what they hold."""

    loop: asyncio.AbstractEventLoop
    write_blocked_since: float

    def hold_body(self, n: int) -> None: ...

    def release(self, n: int) -> None: ...

    def stream_done(self, stream: S) -> None: ...

    async def wait_on_client(self, stream: S, waiter: asyncio.Future[None]) -> None: ...

    def body_consumed(self, stream: S, n: int) -> None: ...

    def send_head(self, stream: S, end_stream: bool) -> None: ...

    def send_hints(self, stream: S, links: list[bytes]) -> None: ...

    def send_body(self, stream: S, data: memoryview, end: bool) -> int: ...

    def send_trailers(self, stream: S, headers: list[tuple[bytes, bytes]]) -> None: ...

    def reset_stream(self, stream: S, code: int) -> None: ...
