"""The connection contract: what a client can count on, whichever loop serves it.

Both loops (:mod:`refork.serving.threaded` for WSGI, :mod:`refork.serving.aio` for ASGI) apply
these rules instead of spelling them out themselves:

- **Timeouts**, judged by :meth:`Timeouts.expiry` once a second (no timer per request):
  an idle keep-alive connection is closed after ``keepalive``; a request head must arrive within
  ``header_timeout`` of its first byte; a request body within ``body_timeout`` of the end of its
  head (a total: a trickle of bytes does not re-arm it); both answer 408 and close. A response
  write that makes no progress for ``write_timeout`` cuts the connection.
- **The drain on stop**: a stopping worker stops accepting but keeps idle connections open for
  :data:`DRAIN_GRACE` (closing one at once races with a client sending on it right now, which
  would see a reset); every request that arrives meanwhile is served with ``Connection: close``.
- **The access-log line**: :func:`log_access`.
- **The clean-up after a fork** at a safe point: :func:`release_after_fork`.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from refork.config import Config
from refork.http.events import Request
from refork.http.parser import Limits
from refork.logs import AccessLog

log = logging.getLogger("refork")

DRAIN_GRACE = 1.0  # seconds a stopping worker still serves requests on open connections
TICK = 1.0  # seconds between two sweeps of the connections (a quarter of it while draining)


class Phase(enum.Enum):
    """Where a connection is between two reads; each phase has its own deadline."""

    IDLE = "idle"  # between requests (keep-alive)
    HEAD = "head"  # part of a request head received
    BODY = "body"  # head complete, body still coming
    BUSY = "busy"  # the app has the request: --timeout (the worker's deadline) applies, not ours


class Expiry(enum.Enum):
    """What the sweep does with a connection."""

    NONE = "none"  # within its deadline
    CLOSE = "close"  # idle too long (or drained): close quietly
    REQUEST_TIMEOUT = "408"  # a request did not arrive in time: answer 408 and close


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The per-connection deadlines, in seconds."""

    header: float
    body: float
    write: float
    keepalive: float

    @classmethod
    def from_config(cls, config: Config) -> Timeouts:
        body, write = config.body_timeout, config.write_timeout
        return cls(
            header=float(config.header_timeout),
            body=float(body) if body is not None else max(float(config.timeout), config.header_timeout),
            write=float(write) if write is not None else float(config.timeout),
            keepalive=float(config.keepalive),
        )

    def drain_until(self, now: float) -> float:
        """When a worker that starts draining now closes its idle connections."""
        return now + min(self.keepalive, DRAIN_GRACE)

    def expiry(self, phase: Phase, since: float, now: float, drain_until: float = 0.0) -> Expiry:
        """The verdict for a connection in `phase` since `since`; `drain_until` is set while stopping."""
        if phase is Phase.IDLE:
            if now - since > self.keepalive or (drain_until and now >= drain_until):
                return Expiry.CLOSE
            return Expiry.NONE
        if phase is Phase.BUSY:
            return Expiry.NONE
        limit = self.header if phase is Phase.HEAD else self.body
        return Expiry.REQUEST_TIMEOUT if now - since > limit else Expiry.NONE

    def write_stalled(self, blocked_since: float, now: float) -> bool:
        """A write blocked (the client stopped reading) since `blocked_since` (0: not blocked)."""
        if blocked_since and now - blocked_since > self.write:
            log.debug(WRITE_STALLED, self.write)
            return True
        return False


WRITE_STALLED = "write timeout: no progress for %.1f s, cutting the connection"


def request_limits(config: Config) -> Limits:
    """The parser's limits from the limit_request_* settings (refork.http knows no Config)."""
    return Limits(
        max_request_line=config.limit_request_line,
        max_header_count=config.limit_request_fields,
        max_header_size=config.limit_request_field_size,
        max_body=config.limit_request_body,
    )


def log_access(
    access_log: AccessLog,
    request: Request,
    remote: str | None,
    status: int,
    length: int,
    duration: float,
) -> None:
    """One access-log line for a finished response; a failing log never fails the request."""
    try:
        access_log.log(
            remote=remote or "-",
            method=request.method,
            target=request.target,
            http_version=request.http_version,
            status=status,
            length=length,
            duration=duration,
            headers=request.headers,
        )
    except Exception:
        log.exception("access log failed")


def release_after_fork(fds: Iterable[int]) -> None:
    """In a child forked at a safe point: turn its copies of the client sockets into /dev/null.

    The parent keeps serving those connections. The child's copies must neither keep them open
    (a close by the parent would not reach the client) nor ever be read or written, whatever
    object still refers to them; the fd numbers stay taken, so nothing else reuses them either.
    """
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        log.debug("cannot open %s to release client sockets after fork", os.devnull, exc_info=True)
        return
    try:
        for fd in fds:
            if fd >= 0:
                try:
                    os.dup2(null, fd)
                except OSError:
                    continue
    finally:
        os.close(null)
