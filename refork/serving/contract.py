"""What a connection loop and the worker process that runs it promise each other.

The loops import this module, never the ``refork.serving`` package, so the package can import
the loops without a cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from refork._native import HandOver, StartResponse
    from refork.wsgi.response import _Exchange


class WorkerControl(Protocol):
    """The worker's side of a connection loop."""

    def fileno(self) -> int:
        """The monitor's command socket: watch it for readability and then call on_readable()."""

    def on_readable(self) -> None:
        """Read and act on pending monitor commands (may set stopping / safe_point_wanted)."""

    @property
    def stopping(self) -> bool:
        """Graceful stop: stop accepting, finish in-flight requests, close idle connections, return."""

    @property
    def exit_now(self) -> bool:
        """Stop at once: return from serve() without finishing anything."""

    @property
    def safe_point_wanted(self) -> bool:
        """The worker wants at_safe_point() called when no request is in flight."""

    def ready_for_requests(self) -> None:
        """The loop can serve now: for ASGI after lifespan startup succeeded (an app whose
        startup opens its database pool is not ready before), for WSGI at once. Called once."""

    def at_safe_point(self) -> None:
        """Called on the loop thread with no request in flight and no other thread alive.

        It may fork. In the forked child it raises an exception derived from SystemExit that must
        propagate out of serve() untouched.
        """

    def request_started(self, method: str, path: bytes) -> object:
        """A complete request is about to be handed to the app, on the thread that will run it
        (the event loop's for ASGI). Thread-safe. Returns a token for the calls below."""

    def request_waiting(self, token: object) -> None:
        """That request now waits on its client (body, or a response it reads slowly). Thread-safe.

        The worker's deadline (--timeout) measures time in the app: a waiting request does not
        hold it; the connection's body and write timeouts bound the wait instead.
        """

    def request_upgraded(self, token: object) -> None:
        """That request is now an open WebSocket (accepted): in flight until request_finished, it
        holds no deadline (like request_waiting) and is counted as an open WebSocket. Loop thread."""

    def http2_count(self, what: str, n: int = 1) -> None:
        """Add `n` to one of the worker's HTTP/2 counts (refork.process.slots.H2_WORDS): open
        "connections" (+1, then -1 when it is lost), "streams" opened by clients, "requests"
        answered, "resets_received", "resets_sent", "goaways_sent". Loop thread."""

    def static_count(self, status: int) -> None:
        """A --static mount answered the request this code serves with `status`: counted apart
        (refork_static_requests_total), and left out of the app's requests. Thread-safe."""

    def request_resumed(self, token: object) -> None:
        """That request is back in the app (after request_waiting). Thread-safe."""

    def request_finished(self, token: object, status: int) -> None:
        """The response for that request is fully written (or failed). Thread-safe.

        ``status`` is the status line sent, 0 when none was (the client went away first).
        """

    def health(self, kind: str) -> int:
        """The status for a health check (--health-path) of `kind`, "live" or "ready": 200 or 503.
        Called on the loop thread; reads shared memory only (no message, no lock)."""

    @property
    def free_threads_elsewhere(self) -> bool:
        """Another worker has an app thread free (the monitor's last count): a worker whose own
        are all busy stops accepting then, so the kernel offers new connections to that one."""

    def free_threads_address(self) -> int:
        """Where the count behind free_threads_elsewhere lives, for a native I/O thread that
        reads it without the GIL (an 8-byte word of a shared page); 0 when there is none."""

    @property
    def websocket_grace(self) -> float:
        """Seconds this stopping worker may keep serving its open WebSockets (it is retired and its
        replacement serves); 0: close them with the stop."""

    @property
    def server_draining(self) -> bool:
        """The whole server is stopping (not just this worker): a stopping worker then takes every
        connection queued in the listen backlog before it stops accepting, so none is reset."""

    def tick(self) -> None:
        """Called on the loop thread at least once a second: liveness, idle work."""


class HandOverHost(Protocol):
    """What a native engine calls on its host (refork.serving.wsgi.engine_host, pool_host) when the
    app's response leaves the engine's path (write(), a generator, a file, an app error): two
    public entry points, typed here and in refork/_native.pyi, nothing else by name."""

    def response_exchange(self, start: StartResponse, /) -> _Exchange:
        """The Python response state for that request (start_response called, or write() used):
        `start` says its connection, its request and what start_response set."""

    def finish_response(self, hand_over: HandOver, /) -> bool | None:
        """Send the response the engine did not frame and account the request. The single-thread
        engine's host then serves the connection itself (None); the pool engine's gives it back
        (True: the engine may keep it)."""
