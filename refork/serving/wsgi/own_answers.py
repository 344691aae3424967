"""What the Python loop answers itself, on the loop thread, with no app call: a WebSocket
handshake's refusal and a ``--health-path`` check."""

from __future__ import annotations

import socket
from typing import Any

from refork.http.events import Request
from refork.http.response import simple_response
from refork.serving.connection import RequestEnd, log_access
from refork.serving.contract import WorkerControl
from refork.serving.health import health_response

# A WebSocket handshake to a WSGI app (WSGI has no WebSocket interface): 400, not the app's to see.
# 4xx: the request asks what this endpoint cannot do, nothing failed on the server (no 5xx alert);
# not 403, which an ASGI app's refusal answers (the two stay distinguishable); not 426, which asks
# the client to upgrade. gunicorn hands the request to the app, which then answers it as plain HTTP.
WEBSOCKET_REFUSED = (
    b"WebSocket upgrade refused: this server runs a WSGI app, which cannot accept WebSockets\n"
)


def refuse_websocket(sock: socket.socket, client: Any, request: Request,
                     access_log: RequestEnd | None) -> None:  # fmt: skip
    """A WebSocket handshake (see WEBSOCKET_REFUSED): answered, and logged."""
    try:
        sock.send(simple_response(400, WEBSOCKET_REFUSED))
    except OSError:
        pass
    if access_log is not None:
        remote = client[0] if isinstance(client, tuple) else None
        log_access(access_log, request, remote, 400, len(WEBSOCKET_REFUSED), 0.0)


def answer_health(sock: socket.socket, request: Request, kind: str | None, control: WorkerControl,
                  keep: bool) -> bool:  # fmt: skip
    """A --health-path check (no app, no count, no access log); True to keep the connection."""
    data = health_response(control.health(kind or "live"), request.method, keep)
    try:
        return sock.send(data) == len(data) and keep
    except OSError:
        return False
