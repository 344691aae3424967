"""The native WSGI loop with one app thread: refork._native.Engine serves the request path.

The engine (Rust, native/src/engine/) runs the hot loop: accept, read, parse, environ, the app
call and a list body written in one send, for every plain connection. Its host
(:class:`EngineHost`) owns a Python loop (:class:`refork.serving.wsgi.python_loop.PythonLoop`, with the
native parts) that stays the outer one and keeps everything else, unchanged: the control
socket, TLS listeners, ticks, the drain, safe points, and every connection or response the
engine does not take, which the engine hands over with its unconsumed bytes (returned by
``Engine.run``) or mid-response (:meth:`EngineHost.response_exchange`,
:meth:`EngineHost.finish_response`). Once such a connection is between two requests again, with
nothing half-read or half-written, it goes back to the engine (:meth:`NativeSide.listener_for`).

The engine starts no thread and exists only in a serving worker: a mold has none, and a
promoted worker's child forgets the engine's connections at the safe point.
"""

from __future__ import annotations

import logging
import signal
import socket
from typing import Any

from refork import _native, deadlines
from refork.config import Config
from refork.serving.contract import WorkerControl
from refork.serving.poller import Poller
from refork.serving.settings import ServingSettings
from refork.serving.wsgi.accepting import Listeners
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.native_host import NativeHost, NativeSide, refs
from refork.wsgi.response import _Exchange

log = logging.getLogger("refork")


class EngineHost(NativeHost):
    """The engine (threads == 1) serving the plain listeners, beside the Python loop it owns."""

    engine: _native.Engine

    def __init__(
        self, listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
        settings: ServingSettings,
    ) -> None:  # fmt: skip
        super().__init__(listeners, app, config, control, settings)
        self.engine = _native.Engine(self, self._native_listeners(), refs())
        side = EngineSide(self.engine, self.poller, self.engine_listeners, control, settings)
        self.loop = self._own_loop(side, AppThreads)

    def run(self) -> None:
        # the engine's requests: registered with the clock only if asked (deadlines.ENGINE)
        serving = deadlines.current.set(deadlines.ENGINE if self.engine.accounts else None)
        # a signal wakes the engine at once (its handlers' flags are the Python loop's to read),
        # so its run() may serve many wake-ups before the loop's turn
        woken, waker = socket.socketpair()
        woken.setblocking(False)
        waker.setblocking(False)
        try:
            before = signal.set_wakeup_fd(waker.fileno(), warn_on_full_buffer=False)
            self.engine.watch_signals(woken.fileno())
        except ValueError:  # not the main thread: run() only looks after its first wait
            before = None
        try:
            self.loop.run()
        finally:
            if before is not None:
                signal.set_wakeup_fd(before)
            woken.close()
            waker.close()
            deadlines.current.reset(serving)

    # ---------------------------------------------------------------- called by the engine

    def response_exchange(self, start: _native.StartResponse) -> _Exchange:
        """The app's response leaves the engine's path (write(), or anything but a list body): the
        Python response state for it, over the loop's output for the connection."""
        conn = self.loop.connection(start.fd, start.client, self.engine_listeners[start.listener_fd][1])
        conn.out.token = self._request_token()
        return self._exchange(start, conn.out)

    def _request_token(self) -> object:
        """The token of the request in the app (the engine's, registered now if need be)."""
        token = deadlines.current.get()
        if token is deadlines.ENGINE:
            clock = getattr(self.control, "clock", None)
            token = clock.engine_request() if clock is not None and clock.engine_request else None
        return token

    def finish_response(self, hand_over: _native.HandOver) -> None:
        """Send a response the engine did not frame, then the loop serves the connection."""
        h = hand_over
        ex = h.start_response.exchange_now()
        conn = self.loop.connection(h.fd, h.client, self.engine_listeners[h.listener_fd][1])
        self.loop.finish_handed(conn, ex, h.environ, h.request, h.result, h.exc, h.stream, h.token, h.started,
                                h.rest)  # fmt: skip


class EngineSide(NativeSide):
    """The engine beside the loop: it serves while the loop waits (poll)."""

    engine: _native.Engine

    def __init__(self, engine: _native.Engine, poller: Poller, listeners: Listeners, control: WorkerControl,
                 settings: ServingSettings) -> None:  # fmt: skip
        super().__init__(engine, poller, listeners, control)
        self.timeouts = settings.timeouts
        self.returning: list[tuple[int, Any, int, float]] = []  # for the engine, after its run()

    def hand_back(self, fd: int, client: Any, listener: int, since: float) -> None:
        # (this may run inside engine.run(): a response the engine handed over mid-request)
        self.returning.append((fd, client, listener, since))

    def drained(self) -> bool:
        return not self.returning and super().drained()

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        """The engine serves until the loop's own fds are ready (or the timeout, or a signal)."""
        while self.returning:
            self.engine.adopt(*self.returning.pop())
        keep_alive = self.timeouts.keep_alive(self.draining or self.control.stopping)
        handed, ready = self.engine.run(timeout, keep_alive)
        if handed:
            self._hand_over(handed)
        return self.poller.poll(0) if ready else []

    def sweep(self, now: float) -> None:
        self.engine.sweep(now)

    def before_safe_point(self) -> None:
        while self.returning:  # the engine's again before the fork (a child forgets them with it)
            self.engine.adopt(*self.returning.pop())


def serve_wsgi_engine(
    listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
    settings: ServingSettings,
) -> None:
    """Serve WSGI with the engine (one app thread) until the control says stop."""
    EngineHost(listeners, app, config, control, settings).run()
