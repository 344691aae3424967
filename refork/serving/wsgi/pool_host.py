"""The native WSGI loop with a pool of app threads (``--threads N``): refork._native.PoolEngine.

The engine's I/O thread (Rust, native/src/pool/io.rs) owns the plain connections and never takes
the GIL: accept, reads, the common request shape, deadlines, slow writes. A complete request is
queued for the app threads, which are this module's: each runs ``PoolEngine.work()``, which waits
for a request with the GIL released, calls the app, and writes a list body in one send without
the GIL. So idle and slow connections cost no thread, and no request waits for an I/O loop to
get the GIL.

Its host (:class:`PoolHost`) owns a Python loop that stays the outer one, on the worker's main
thread, as with the single-thread engine (:mod:`refork.serving.wsgi.engine_host`): the control
socket, TLS listeners, ticks, the drain, safe points, and every connection the engine hands over
(any other request shape, a body to spool, a health check, X-Forwarded-*), which it serves as
the Python loop does, its jobs run by the same app threads. A response the engine does not frame
(a generator, a file, write(), an app error) is sent by the Python response path on the app
thread (:meth:`PoolHost.finish_response`) and the connection goes back to the engine.

Forks: at a safe point the I/O thread is joined and the app threads too, so a promoted worker's
child holds no thread of the pool; it forgets the engine's connections.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from typing import Any, cast

from refork import _native, deadlines
from refork.config import Config
from refork.serving.contract import WorkerControl
from refork.serving.outbox import Outbox
from refork.serving.poller import Poller
from refork.serving.settings import ServingSettings
from refork.serving.wsgi import timed_out
from refork.serving.wsgi.accepting import Listeners
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.native_host import NativeHost, NativeSide, refs
from refork.wsgi import Streaming
from refork.wsgi.response import _Exchange, continue_wsgi

log = logging.getLogger("refork")


class EngineThreads(AppThreads):
    """The app threads of a PoolEngine: each serves the engine's requests and the loop's jobs."""

    def __init__(self, size: int, handler: Callable[..., None], engine: _native.PoolEngine) -> None:
        super().__init__(size, handler)
        self.engine = engine

    def submit(self, job: tuple[Any, ...]) -> None:
        self.engine.submit(job)

    def stop(self) -> None:
        self.engine.stop_workers(len(self.threads))
        for t in self.threads:
            t.join()
        self.threads = []

    def _run(self) -> None:
        engine = self.engine
        while True:
            try:
                engine.work(self.handler)
                return
            except SystemExit:  # sys.exit() in app code must not silently shrink the pool
                log.error("SystemExit raised by the app in a pool thread: ignored")


class PoolHost(NativeHost):
    """The pool engine (threads > 1) serving the plain listeners, beside the Python loop it owns."""

    engine: _native.PoolEngine

    def __init__(
        self, listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
        settings: ServingSettings,
    ) -> None:  # fmt: skip
        super().__init__(listeners, app, config, control, settings)
        self.engine = engine = _native.PoolEngine(self, self._native_listeners(), refs())
        self.side = PoolSide(engine, self.poller, self.engine_listeners, control)
        self.loop = self._own_loop(self.side, lambda size, job: EngineThreads(size, job, engine))

    def run(self) -> None:
        self.poller.register(self.side.engine_fd)
        self.engine.start()
        self.loop.run()

    # ---------------------------------------------------------------- called by the engine
    # (both on an app thread: responses the engine does not frame)

    def response_exchange(self, start: _native.StartResponse) -> _Exchange:
        """The Python response state of an engine request, over a blocking output of its socket
        (borrowed: finish_response gives the fd back to the engine)."""
        sock = socket.socket(fileno=start.fd)
        sock.setblocking(False)
        out = Outbox(sock, start.client, self.settings.timeouts.write, self.control, buffering=False)
        out.token = deadlines.current.get()
        self.side.responding[start.fd] = out
        return self._exchange(start, out)

    def finish_response(self, hand_over: _native.HandOver) -> bool:
        """Send a response the engine did not frame (refork.wsgi.continue_wsgi, blocking) and
        account it; True when the engine may keep the connection."""
        environ, request, token = hand_over.environ, hand_over.request, hand_over.token
        result, exc, started = hand_over.result, hand_over.exc, hand_over.started
        began = started if started is not None else time.perf_counter()
        ex = hand_over.start_response.exchange_now()
        out = cast(Outbox, ex.out)  # (made by response_exchange)
        out.token = token  # (the app's call is over: deadlines.current no longer has it)
        serving = deadlines.current.set(token)
        try:
            outcome = continue_wsgi(ex, environ, request, result, exc=exc)
        except Exception:
            log.exception("Error serving a request")
            outcome = (ex.code, ex.framer.body_bytes, False)
        finally:
            deadlines.current.reset(serving)
            self.side.responding.pop(out.fd, None)
            out.sock.detach()  # the engine's connection again
        assert not isinstance(outcome, Streaming)  # a blocking output never waits
        return self.loop.finished(request, environ, hand_over.stream, token, began, outcome, ex)


class PoolSide(NativeSide):
    """The pool engine beside the loop: its I/O thread serves on its own; its news wake the loop."""

    engine: _native.PoolEngine

    def __init__(self, engine: _native.PoolEngine, poller: Poller, listeners: Listeners,
                 control: WorkerControl) -> None:  # fmt: skip
        super().__init__(engine, poller, listeners, control)
        self.engine_fd: int = engine.wake_fd
        self.responding: dict[int, Outbox] = {}  # the engine's responses on the Python path, by fd

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        """The loop's ready fds; the engine's news (connections handed over, log lines) first."""
        self.engine.hold(self.control.safe_point_wanted)
        ready = self.poller.poll(timeout)
        for i, (fd, _) in enumerate(ready):
            if fd == self.engine_fd:
                del ready[i]
                self._from_engine()
                break
        return ready

    def _from_engine(self) -> None:
        handed, notices = self.engine.take()
        for is_error, message in notices:
            (log.error if is_error else log.warning)("%s", message)
        self._hand_over(handed)

    def app_idle(self) -> bool:
        return self.engine.in_flight == 0

    def answer_timed_out(self) -> None:
        for fd in self.engine.in_app:
            if not timed_out.started(self.responding.get(fd)):
                timed_out.answer_fd(fd)

    def free_threads(self) -> int | None:
        return int(self.engine.free_threads)  # the engine counts the jobs of both loops

    def before_safe_point(self) -> None:
        self.engine.pause()  # no thread of the engine at the fork

    def after_safe_point(self) -> None:
        self.engine.start()
        self.engine.hold(False)


def serve_wsgi_pool(
    listeners: list[socket.socket], app: Any, config: Config, control: WorkerControl,
    settings: ServingSettings,
) -> None:
    """Serve WSGI with the pool engine (threads > 1) until the control says stop."""
    PoolHost(listeners, app, config, control, settings).run()
