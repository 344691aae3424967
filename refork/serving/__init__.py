"""Connection loops: accept, read, parse, call the app, write. One per interface.

A worker process hands its listening sockets, the app and a :class:`WorkerControl` to
:func:`serve`. The loop knows nothing about processes: everything it must tell the worker (a
request started or finished, a safe point was reached) goes through the control object. A native
(Rust) loop can replace a Python one here without touching process management. What both loops
promise a client (timeouts, the drain on stop, the access-log line, the clean-up after a fork) is
written once, in :mod:`refork.serving.connection`.
"""

from __future__ import annotations

import socket
from typing import Any

from refork.config import Config
from refork.serving.contract import WorkerControl

__all__ = ["WorkerControl", "serve"]


def serve(
    listeners: list[socket.socket], app: Any, interface: str, config: Config, control: WorkerControl
) -> None:
    """Serve until control says stop; interface is "wsgi" or "asgi" (already resolved).

    The loops are imported here, on demand: a WSGI worker never imports asyncio.
    """
    if interface == "asgi":
        from refork.serving.aio import serve_asgi

        serve_asgi(listeners, app, config, control)
    else:
        from refork.serving.threaded import serve_wsgi

        control.ready_for_requests()  # no start-up work in the loop (the app was loaded and warmed)
        serve_wsgi(listeners, app, config, control)
