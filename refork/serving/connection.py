"""The connection contract: what a client can count on, whichever loop serves it.

Both loops (:mod:`refork.serving.wsgi.python_loop` for WSGI, :mod:`refork.serving.asgi.server` for ASGI) apply
these rules instead of spelling them out themselves:

- **Timeouts**, judged by :meth:`Timeouts.expiry` once a second (no timer per request):
  an idle keep-alive connection is closed after ``keepalive`` (0: each response closes its connection,
  :meth:`Timeouts.keep_alive`, and a new one waits ``header_timeout`` for its first request); a
  request head must arrive within ``header_timeout`` of its first byte; a request body within
  ``body_timeout`` of the end of its head, extended by one second per ``body_min_rate`` bytes
  received (Apache mod_reqtimeout's design: a total, so a trickle does not re-arm it, yet a big
  honest upload is never cut); both
  answer 408 and close. A response write that makes no progress for ``write_timeout`` cuts the
  connection. None of this is the worker's ``--timeout``: that one measures time *in the app*
  only (see :class:`refork.process.slots.AppClock`), so a slow client costs its own connection
  and never the worker with everyone else's requests on it.
- **The drain on stop**: a stopping worker stops accepting but keeps idle connections open for
  :data:`DRAIN_GRACE` (closing one at once races with a client sending on it right now, which
  would see a reset); every request that arrives meanwhile is served with ``Connection: close``.
- **The close after a** ``Connection: close`` **response** (or a refusal): a FIN, never a reset:
  the loops close lingering (the WSGI loop: :mod:`refork.serving.lingering`).
- **The access-log line**: :func:`log_access`.
- **The clean-up after a fork** at a safe point: :func:`release_after_fork`.
"""

from __future__ import annotations

import enum
import logging
import os
import socket
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from refork.config import Config
from refork.http.events import Request
from refork.http.parser import Limits

log = logging.getLogger("refork")

DRAIN_GRACE = 1.0  # seconds a stopping worker still serves requests on open connections
TICK = 1.0  # seconds between two sweeps of the connections (a quarter of it while draining)


class Phase(enum.Enum):
    """Where a connection is between two reads; each phase has its own deadline."""

    IDLE = "idle"  # between requests (keep-alive)
    HEAD = "head"  # part of a request head received
    BODY = "body"  # head complete, body still coming
    BUSY = "busy"  # the app has the request: --timeout (the worker's deadline) applies, not ours
    WRITING = "writing"  # a response waits for the client to read: the write timeout applies


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
    body_min_rate: float = 0.0  # bytes per second that each extend the body deadline by a second

    @classmethod
    def from_config(cls, config: Config) -> Timeouts:
        return cls(
            header=float(config.header_timeout),
            body=float(config.body_timeout),
            write=float(config.write_timeout),
            keepalive=float(config.keepalive),
            body_min_rate=float(config.body_min_rate),
        )

    def keep_alive(self, stopping: bool) -> bool:
        """Whether a response may leave its connection open for another request (else it says
        ``Connection: close`` and the connection closes once it is out): not once the worker stops
        (`stopping`: drains), never with ``keepalive`` 0 (gunicorn's ``--keep-alive 0``)."""
        return self.keepalive > 0 and not stopping

    def idle_limit(self, fresh: bool) -> float:
        """How long a connection may wait for its next request: ``keepalive``; with ``keepalive`` 0
        (no reuse) a `fresh` one (no byte yet) still gets ``header`` for its first, as HTTP/2's does."""
        return self.header if fresh and not self.keepalive else self.keepalive

    def drain_until(self, now: float) -> float:
        """When a worker that starts draining now closes its idle connections."""
        return now + min(self.keepalive, DRAIN_GRACE)

    def expiry(
        self, phase: Phase, since: float, now: float, drain_until: float = 0.0, received: int = 0,
        fresh: bool = False,
    ) -> Expiry:
        """The verdict for a connection in `phase` since `since`; `drain_until` is set while stopping.

        `received`: body bytes received so far (phase BODY), each ``body_min_rate`` of them one
        more second.
        """
        if phase is Phase.IDLE:  # a fresh connection (no byte yet) keeps its clock through a drain:
            # its client sent no request before the stop and may be about to; it is owed an answer
            if now - since > self.idle_limit(fresh) or (drain_until and now >= drain_until and not fresh):
                return Expiry.CLOSE
            return Expiry.NONE
        if phase is Phase.HEAD:
            limit = self.header
        elif phase is Phase.BODY:
            limit = self.body + (received / self.body_min_rate if self.body_min_rate else 0.0)
        else:  # BUSY, WRITING: the worker's deadline, write_stalled()
            return Expiry.NONE
        return Expiry.REQUEST_TIMEOUT if now - since > limit else Expiry.NONE

    def write_stalled(self, blocked_since: float, now: float) -> bool:
        """A write blocked (the client stopped reading) since `blocked_since` (0: not blocked)."""
        return bool(blocked_since) and now - blocked_since > self.write


def log_write_timeout(timeout: float, client: object, request: Request | None, cut: str = "connection cut"
                      ) -> None:  # fmt: skip
    """Warn that a client stopped reading (write_timeout_line)."""
    log.warning("%s", write_timeout_line(timeout, client, request, cut))


def write_timeout_line(timeout: float, client: object, request: Request | None, cut: str = "connection cut"
                       ) -> str:  # fmt: skip
    """The line an operator needs when a client stopped reading: who, which request, what was cut
    (the connection, or an HTTP/2 stream only). tests/vectors/write_timeout.txt; the engines' twin:
    native conn/mod.rs Conn::write_timeout_line."""
    what = f"{request.method} {request.target.decode('latin-1')}" if request is not None else "-"
    return f"write timeout: {peer_text(client)} stopped reading {what} for {timeout:.1f} s; {cut}"


def peer_text(client: object) -> str:
    """A loop's client tuple as the log lines name it (tests/vectors/peer.txt; the engines' twin:
    native conn/mod.rs peer_text): host:port, [host]:port for IPv6, or a unix-socket client."""
    if isinstance(client, tuple) and len(client) >= 2:
        host = str(client[0])
        return f"[{host}]:{client[1]}" if ":" in host else f"{host}:{client[1]}"
    return "a unix-socket client"


def request_limits(config: Config) -> Limits:
    """The parser's limits from the limit_request_* settings (refork.http knows no Config)."""
    return Limits(
        max_request_line=config.limit_request_line,
        max_header_count=config.limit_request_fields,
        max_header_size=config.limit_request_field_size,
        max_body=config.limit_request_body,
    )


class RequestEnd(Protocol):
    """What a loop tells when a response is done: the access log (refork.logs.AccessLog), or
    refork.serving.request_hooks.Finisher (the line, then gunicorn's post_request hook)."""

    def write(self, request: Request, remote: str | None, status: int, length: int, duration: float,
              environ: dict[str, Any] | None = ...,
              response_headers: list[tuple[bytes, bytes]] | None = ...) -> None: ...  # fmt: skip


def log_access(
    access_log: RequestEnd,
    request: Request,
    remote: str | None,
    status: int,
    length: int,
    duration: float,
    environ: dict[str, Any] | None = None,
    response_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """One access-log line for a finished response; a failing log never fails the request.

    `environ`: the WSGI environ (None on the ASGI loop); `response_headers`: the app's. A HEAD
    response's body, counted by the framers, is logged as the 0 bytes that went out.
    """
    if request.method == "HEAD":
        length = 0
    try:
        access_log.write(request, remote, status, length, duration, environ, response_headers)
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


def _local_key(sock: socket.socket) -> object:
    """What a connection accepted from a listener shares with it: the port (a listener on a
    wildcard address accepts on a specific one), or a Unix socket's path."""
    name = sock.getsockname()
    return (sock.family, name[1]) if sock.family in (socket.AF_INET, socket.AF_INET6) else (sock.family, name)


def accepted_fds(listeners: Iterable[socket.socket]) -> list[int]:
    """The fds of this process's connections accepted from `listeners`, found by what the kernel
    says of every open fd (a stream socket, not listening, on a listener's port or path): the
    ones a loop tracks and the ones it does not yet (asyncio accepts in one iteration and makes
    the protocol in the next; a TLS connection is its own only after the handshake). A child
    forked at a safe point releases them all (release_after_fork): one it kept would hold its
    client's connection open after the parent closed it, the client waiting on it for ever."""
    keys = {_local_key(lsock) for lsock in listeners}
    fds = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if (
                sock.type == socket.SOCK_STREAM
                and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                and _local_key(sock) in keys
            ):
                fds.append(fd)
        except OSError:
            pass
        finally:
            sock.close()
    return fds
