"""What both engine hosts share (:class:`NativeHost`): the Python loop they own, what the Rust
engines read of the host, and what serves beside the loop (:class:`NativeSide`): the engine, to
which the loop hands connections back.

An engine host (:mod:`refork.serving.wsgi.engine_host`, :mod:`refork.serving.wsgi.pool_host`)
gives the engine the plain listeners and owns a Python loop
(:class:`refork.serving.wsgi.python_loop.PythonLoop`, with the parts of
:data:`refork.serving.wsgi.native_parts.NATIVE`) for everything else: the control socket, TLS
listeners, ticks, the drain, safe points, and every connection or response the engine does not
take. The engine hands a connection over with its unconsumed bytes, or mid-response
(``response_exchange``, ``finish_response``); once it is between two requests again, with nothing
half-read or half-written, it goes back to the engine (:meth:`NativeSide.listener_for`).

The host owns the engine, the loop and the side; the loop holds the side only (never the host),
and the side the engine: what the engine hands over waits in the side (``handed``) for the loop.
"""

from __future__ import annotations

import io
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from refork import _native, deadlines
from refork.config import Config
from refork.http.body import EMPTY_INPUT, InputStream
from refork.http.events import Request
from refork.http.response import ResponseFramer, simple_response
from refork.serving.connection import Phase, RequestEnd, log_access
from refork.serving.contract import WorkerControl
from refork.serving.outbox import Outbox
from refork.serving.poller import Poller
from refork.serving.settings import ServingSettings
from refork.serving.wsgi.accepting import Listeners, listening
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.beside import Adopted, Beside, NoAppWork
from refork.serving.wsgi.conn import Conn
from refork.serving.wsgi.native_parts import NATIVE, NativeEnvironBuilder
from refork.serving.wsgi.python_loop import PythonLoop
from refork.wsgi import response as wsgi_response
from refork.wsgi.files import FileWrapper, file_span
from refork.wsgi.response import _Exchange

if TYPE_CHECKING:
    from refork._native import _Refs

log = logging.getLogger("refork")


def _memory_input(data: bytes) -> InputStream:
    return InputStream(io.BytesIO(data), len(data))


def _close_input(stream: InputStream) -> None:
    stream.close()


def _log_access(access_log: RequestEnd, line: _native.AccessLine) -> None:
    log_access(access_log, request=line.request, remote=line.remote, status=line.status,
               length=line.length, duration=line.duration, environ=line.environ,
               response_headers=line.response_headers)  # fmt: skip


def _wrapper_span(wrapper: FileWrapper) -> tuple[int, int, int] | None:
    return file_span(wrapper.filelike)


def refs() -> _Refs:
    """What the engine calls in refork (its own copy of nothing: the same caches and checks)."""
    return {
        "current": deadlines.current,
        "request_cls": Request,
        "make_input": _memory_input,
        "close_input": _close_input,
        "empty_input": EMPTY_INPUT,
        "status_cache": wsgi_response._STATUS_CACHE,
        "header_cache": wsgi_response._HEADER_CACHE,
        "check_status": wsgi_response.check_status,
        "check_header": wsgi_response.check_header,
        "prefetched": wsgi_response.Prefetched,
        "file_wrapper": FileWrapper,
        "file_span": _wrapper_span,
        "closing_failed": wsgi_response.closing_failed,
        "hint_response": wsgi_response.hint_response,
        "log_access": _log_access,
        "log_warning": log.warning,
        "log_error": log.error,
        "perf_counter": time.perf_counter,
        "timeout_response": simple_response(408),
    }


class NativeHost:
    """What both engine hosts share: the listeners split between the engine (the plain ones) and
    the Python loop, what the engine reads of the host, and the connections handed back and forth.
    A subclass makes its engine and side, then the loop (:meth:`_own_loop`)."""

    def __init__(
        self, listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
        settings: ServingSettings,
    ) -> None:  # fmt: skip
        self.app = app
        self.config = config
        self.control = control
        self.settings = settings  # the engine reads its limits, deadlines and constants here
        self.poller = Poller()  # the Python loop's: the single-thread engine waits on it too
        # the worker's budget of request bytes held (--max-request-memory): the engine's and the loop's
        self.memory: _native.MemoryBudget = NATIVE.memory(settings.max_request_memory)
        self.access_log: RequestEnd | None = settings.request_end
        built = listening(listeners, settings, NATIVE.builder)
        self.engine_listeners: Listeners = {
            fd: entry for fd, entry in built.items()
            if fd not in settings.tls and isinstance(entry[1], NativeEnvironBuilder)
        }  # fmt: skip
        self.loop_listeners: Listeners = {fd: e for fd, e in built.items() if fd not in self.engine_listeners}

    def _own_loop(self, side: Beside, app_threads: Callable[[int, Callable[..., None]], AppThreads]
                  ) -> PythonLoop:  # fmt: skip
        """The Python loop, once the engine and its side exist: everything the engine does not serve."""
        return PythonLoop(self.loop_listeners, self.app, self.config, self.control, self.settings, NATIVE,
                          side, app_threads, self.poller, self.memory)  # fmt: skip

    # ---------------------------------------------------------------- what the engines read

    @property
    def poller_fd(self) -> int:
        """The Python loop's epoll fd: the single-thread engine waits on it too."""
        return self.poller.fileno()

    @property
    def keep_alive(self) -> bool:
        """A response may leave its connection open (not with --keep-alive 0)."""
        return self.settings.timeouts.keep_alive(False)

    # what the engines answer a refused PROXY header with (native/src/conn/proxy.rs; settings.proxy)
    proxy_responses = (simple_response(400), simple_response(403))

    @property
    def pre_request_hook(self) -> Any:
        """gunicorn's pre_request as the engines call it before the app (wsgi/app_call.rs), or None;
        post_request runs where the access-log line is written (self.access_log: a Finisher)."""
        hooks = self.settings.request_hooks
        return hooks.before_wsgi if hooks is not None else None

    @staticmethod
    def _exchange(start: _native.StartResponse, out: Outbox) -> _Exchange:
        """The Python response state of an engine request over `out` (the host's output for its
        connection), told what start_response set; the part of an early hint the socket did not
        take goes first."""
        request = start.request
        out.request = request
        ex = _Exchange(ResponseFramer(request, server_keep_alive=start.keep_alive), out)
        if start.status is not None:
            ex.code, ex.reason, ex.headers, ex.has_length = start.status
        if rest := start.take_hint_rest():
            try:
                out.send(rest)
            except OSError:
                pass  # the client is gone: the response's own send finds out
        return ex

    def _native_listeners(self) -> list[tuple[int, _native.Environ]]:
        """(fd, refork._native.Environ) of each listener the engine serves."""
        return [(fd, b.native) for fd, (_, b) in self.engine_listeners.items()]  # type: ignore[attr-defined]


class NativeSide(NoAppWork):
    """What serves beside the Python loop of an engine host (refork.serving.wsgi.beside.Beside):
    its engine. What both engines share; each host's subclass waits its own way (poll)."""

    hands_back = True

    def __init__(self, engine: _native.Engine | _native.PoolEngine, poller: Poller, listeners: Listeners,
                 control: WorkerControl) -> None:  # fmt: skip
        self.engine = engine
        self.poller = poller  # the loop's
        self.listeners = listeners  # the engine's
        self.control = control
        # a connection's listener, by its environ builder (one per listener)
        self.listener_of = {id(b): fd for fd, (_, b) in listeners.items()}
        self.draining = False
        self.handed: list[Adopted] = []  # for the loop (PythonLoop.adopt), after a poll

    def _hand_over(self, handed: Sequence[_native.Handed]) -> None:
        """Connections the engine handed over: for the loop."""
        listeners = self.listeners
        self.handed.extend((h.fd, h.client, listeners[h.listener_fd][1], h.data, h.since, h.fresh, h.held)
                           for h in handed)  # fmt: skip

    def listener_for(self, conn: Conn) -> int | None:
        """A connection the engine handed over (or a response took) that has nothing half-read or
        half-written goes back to the engine: one file or stream response, a chunked upload or a
        health check must not leave a keep-alive connection (an upstream one of a proxy, say) on
        the slower Python loop for good."""
        listener = self.listener_of.get(id(conn.builder))
        if (
            listener is None
            or self.draining
            or conn.closed
            or conn.busy
            or conn.phase is not Phase.IDLE
            or conn.writing is not None
            or conn.request is not None
            or conn.body is not None
            or conn.out.backlogged
            or conn.parser.in_message
        ):
            return None
        return listener

    def hand_back(self, fd: int, client: Any, listener: int, since: float) -> None:
        self.engine.adopt(fd, client, listener, since)

    def drained(self) -> bool:
        return bool(self.engine.idle)

    def begin_drain(self, until: float, take_backlog: bool) -> None:
        self.draining = True
        self.engine.drain(until, take_backlog)
        for lsock, _ in self.listeners.values():
            lsock.close()

    def forked(self) -> None:
        self.engine.release_after_fork()  # the engine's connections are the parent's too

    def shutdown(self) -> None:
        self.engine.close_all()
