"""What the WSGI loop's HTTP/2 parts need of their owners, as Protocols, so that no import points back up.

The loop's request path (:class:`refork.serving.wsgi.request_path.RequestPath`) owns each
connection's HTTP/2 session (:mod:`refork.serving.wsgi.http2`), which owns its streams
(:mod:`refork.serving.wsgi.http2_stream`), and each calls back into its owner. The lower modules
name their owner by these roles only (type-only imports included, no cycle), and the owner
satisfies them structurally: mypy checks it where the owner hands itself down. The roles are
generic in the session and stream types, which live above this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from refork.http.h2 import Http2Connection, Http2Limits
from refork.serving.connection import RequestEnd, Timeouts
from refork.serving.contract import WorkerControl
from refork.serving.health import HealthPaths
from refork.serving.poller import Poller
from refork.serving.request_hooks import RequestHooks
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.conn import Conn

SessionT = TypeVar("SessionT", contravariant=True)  # the loop's HTTP/2 session type (http2.Session)
StreamT = TypeVar("StreamT")  # an HTTP/2 stream type (http2_stream.Stream)
StreamIn = TypeVar("StreamIn", contravariant=True)


class StreamLoop(Protocol):
    """The loop as an HTTP/2 stream's app call sees it."""

    @property
    def app(self) -> Any: ...  # the WSGI application

    @property
    def control(self) -> WorkerControl: ...

    @property
    def request_hooks(self) -> RequestHooks | None: ...

    @property
    def access_log(self) -> RequestEnd | None: ...

    @property
    def timeouts(self) -> Timeouts: ...


class SessionLoop(StreamLoop, Protocol[SessionT, StreamIn]):
    """The loop as an HTTP/2 session sees it: its counters, budget and poller, and the calls back."""

    pool: AppThreads | None
    memory: Any  # the worker's MemoryBudget (refork.http.budget, or refork._native's)
    in_flight: int
    poller: Poller
    read_size: int
    health: HealthPaths | None
    h1: bool
    h2_limits: Http2Limits

    def _close(self, conn: Conn, answered: bool = False) -> None: ...

    def h2_dispatch(self, stream: StreamIn, force: bool = False) -> None: ...

    def h2_kick(self, session: SessionT) -> None: ...


class StreamSession(Protocol[StreamT]):
    """The HTTP/2 session as its streams see it: its lock, its sans-IO connection, its queues."""

    lock: threading.RLock
    h2: Http2Connection
    closed: bool
    released: int
    finished: list[StreamT]
    queued: set[StreamT]

    @property
    def loop(self) -> StreamLoop: ...

    @property
    def conn(self) -> Conn: ...

    def pause(self, stream: StreamT) -> None: ...

    def wait(self, ready: Callable[[], bool], timeout: float) -> bool: ...

    def kick(self) -> None: ...

    def written(self, n: int) -> None: ...

    def backlog(self) -> int: ...
