"""Health checks answered by the connection loops themselves, never by the app.

With ``--health-path PATH`` both loops hand every complete request to :func:`health_kind` before
the app: a request for ``PATH`` or ``PATH/live`` is a liveness check (200 while the worker's loop
serves: a blocked or dead loop does not answer), ``PATH/ready`` a readiness check (200 once the
server is ready, 503 before and from the moment it starts draining; the status comes from the
WorkerControl, which reads the monitor's shared page). Kubernetes' ``/livez`` / ``/readyz`` split.
The answers are tiny fixed responses: not counted as requests, not in the access log.
"""

from __future__ import annotations

from refork.http.events import Request

_REASONS = {200: b"OK", 503: b"Service Unavailable"}
_BODIES = {200: b"ok\n", 503: b"unavailable\n"}


class HealthPaths:
    """The paths of one --health-path setting; `kind(path)` says which check a path is."""

    __slots__ = ("live", "ready")

    def __init__(self, base: str) -> None:
        root = base.rstrip("/").encode("latin-1")
        self.live = (root or b"/", root + b"/live")
        self.ready = root + b"/ready"

    def check(self, request: Request, ended: bool = True) -> str | None:
        """"live", "ready" or None (not a health check: the app's): GET or HEAD without a body, for
        one of the paths byte for byte, any query (tests/vectors/health.txt; the engines' twin:
        native conn/intake.rs is_health). `ended`: False when a body follows that the head does
        not announce (an HTTP/2 HEADERS frame that does not end its stream)."""
        if not ended or request.method not in ("GET", "HEAD") or request.content_length or request.chunked:
            return None
        return self.kind(request.path)

    def kind(self, path: bytes) -> str | None:
        if path == self.ready:
            return "ready"
        if path in self.live:
            return "live"
        return None


def health_paths(base: str) -> HealthPaths | None:
    """None when --health-path is off (the loops then test nothing per request)."""
    return HealthPaths(base) if base else None


def health_response(status: int, method: str, keep_alive: bool) -> bytes:
    """The whole response to a health check; HEAD gets the head only."""
    body = _BODIES.get(status, b"")
    head = (
        b"HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nCache-Control: no-store\r\n"
        % (status, _REASONS.get(status, b"Unknown"), len(body))
    )
    head += b"\r\n" if keep_alive else b"Connection: close\r\n\r\n"
    return head if method == "HEAD" else head + body
