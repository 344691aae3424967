"""Connection loops: accept, read, parse, call the app, write. One per interface.

A worker process hands its listening sockets, the app and a :class:`WorkerControl` to
:func:`serve`. The loop knows nothing about processes: everything it must tell the worker (a
request started or finished, a safe point was reached) goes through the control object. A native
(Rust) loop can replace a Python one here without touching process management.
"""

from __future__ import annotations

import socket
from typing import Any, Protocol

from refork.config import Config


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

    def at_safe_point(self) -> None:
        """Called on the loop thread with no request in flight and no other thread alive.

        It may fork. In the forked child it raises an exception derived from SystemExit that must
        propagate out of serve() untouched.
        """

    def request_started(self) -> object:
        """A complete request is about to be handed to the app. Thread-safe. Returns a token."""

    def request_finished(self, token: object) -> None:
        """The response for that request is fully written (or failed). Thread-safe."""

    def tick(self) -> None:
        """Called on the loop thread at least once a second: liveness, idle work."""


def serve(
    listeners: list[socket.socket], app: Any, interface: str, config: Config, control: WorkerControl
) -> None:
    """Serve until control says stop; interface is "wsgi" or "asgi" (already resolved)."""
    if interface == "asgi":
        from refork.serving.aio import serve_asgi

        serve_asgi(listeners, app, config, control)
    else:
        from refork.serving.threaded import serve_wsgi

        serve_wsgi(listeners, app, config, control)
