"""What both engine hosts share (:class:`NativeHost`): the Python loop they own, what the Rust
engines read of it, and the connections handed back and forth.

An engine host (:mod:`refork.serving.wsgi.engine_host`, :mod:`refork.serving.wsgi.pool_host`)
gives the engine the plain listeners and owns a Python loop
(:class:`refork.serving.wsgi.python_loop.PythonLoop`, with the parts of
:data:`refork.serving.wsgi.native_parts.NATIVE`) for everything else: the control socket, TLS
listeners, ticks, the drain, safe points, and every connection or response the engine does not
take. The engine hands a connection over with its unconsumed bytes, or mid-response
(``response_exchange``, ``finish_response``); once it is between two requests again, with nothing
half-read or half-written, it goes back to the engine (:meth:`NativeHost.take_back`).
"""

from __future__ import annotations

import io
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from refork import _native, deadlines
from refork.config import Config
from refork.http.body import EMPTY_INPUT, InputStream
from refork.http.events import Request
from refork.http.response import ResponseFramer, simple_response
from refork.serving.connection import Phase, RequestEnd, log_access
from refork.serving.contract import WorkerControl
from refork.serving.outbox import Outbox
from refork.serving.settings import ServingSettings
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.conn import Conn
from refork.serving.wsgi.native_parts import NATIVE, NativeEnvironBuilder
from refork.serving.wsgi.python_loop import PythonLoop
from refork.wsgi import EnvironBuilder
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
    """What both engine hosts share: the Python loop they own (its plain listeners go to the
    engine), what the engine reads of it, and the connections handed back and forth. It is what
    serves beside the loop (refork.serving.wsgi.python_loop_lifetime.Beside); ``self.engine`` is set by
    the subclass, once the loop exists."""

    engine: _native.Engine | _native.PoolEngine

    def __init__(
        self, listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
        settings: ServingSettings, app_threads: Callable[[int, Callable[..., None]], AppThreads] = AppThreads,
    ) -> None:  # fmt: skip
        self.loop = loop = PythonLoop(listeners, app, config, control, settings, NATIVE, self, app_threads)
        self.control = control
        self.settings = settings  # the engine reads its limits, deadlines and constants here
        self.engine_listeners: dict[int, tuple[socket.socket, EnvironBuilder]] = {}
        for fd, entry in list(loop.listeners.items()):
            if fd not in loop.tls and isinstance(entry[1], NativeEnvironBuilder):
                self.engine_listeners[fd] = loop.listeners.pop(fd)
        # a connection's listener, by its environ builder (one per listener)
        self.engine_listener_of = {id(b): fd for fd, (_, b) in self.engine_listeners.items()}

    # ---------------------------------------------------------------- what the engines read

    @property
    def app(self) -> Any:
        return self.loop.app

    @property
    def memory(self) -> _native.MemoryBudget:
        memory: _native.MemoryBudget = self.loop.memory
        return memory

    @property
    def access_log(self) -> RequestEnd | None:
        return self.loop.access_log

    @property
    def poller_fd(self) -> int:
        """The Python loop's epoll fd: the single-thread engine waits on it too."""
        return self.loop.poller.fileno()

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
        hooks = self.loop.request_hooks
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

    def _adopt(self, handed: _native.Handed) -> None:
        """A connection the engine hands over: the loop's now."""
        h, builder = handed, self.engine_listeners[handed.listener_fd][1]
        self.loop.adopt(h.fd, h.client, builder, h.data, h.since, h.fresh, h.held)

    # ---------------------------------------------------------------- beside the loop (Beside)

    def take_back(self, conn: Conn) -> bool:
        """A connection the engine handed over (or a response took) that has nothing half-read or
        half-written goes back to the engine: one file or stream response, a chunked upload or a
        health check must not leave a keep-alive connection (an upstream one of a proxy, say) on
        the slower Python loop for good."""
        listener = self.engine_listener_of.get(id(conn.builder))
        if (
            listener is None
            or self.loop.draining
            or conn.closed
            or conn.busy
            or conn.phase is not Phase.IDLE
            or conn.writing is not None
            or conn.request is not None
            or conn.body is not None
            or conn.out.backlogged
            or conn.parser.in_message
        ):
            return False
        self._give_back(self.loop.detach(conn), conn.client, listener, conn.since)
        return True

    def _give_back(self, fd: int, client: Any, listener: int, since: float) -> None:
        self.engine.adopt(fd, client, listener, since)

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        raise NotImplementedError  # how the engine is served meanwhile: each host's own

    def app_idle(self) -> bool:
        return True

    def free_threads(self) -> int | None:
        return None

    def drained(self) -> bool:
        return bool(self.engine.idle)

    def begin_drain(self, until: float, take_backlog: bool) -> None:
        self.engine.drain(until, take_backlog)
        for lsock, _ in self.engine_listeners.values():
            lsock.close()

    def sweep(self, now: float) -> None:
        pass

    def before_safe_point(self) -> None:
        pass

    def after_safe_point(self) -> None:
        pass

    def answer_timed_out(self) -> None:
        pass

    def forked(self) -> None:
        self.engine.release_after_fork()  # the engine's connections are the parent's too

    def shutdown(self) -> None:
        self.engine.close_all()
