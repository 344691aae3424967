"""What both loops need to serve HTTP/2 (refork.http.h2 is the protocol): the limits from the
settings, what ALPN offers, the h2c preface sniff, and the answers refork gives on a stream
itself (a limit's 4xx, a --health-path check), never the app.

The ASGI loop's connection is :mod:`refork.serving.asgi.http2_protocol`, the WSGI loop's
:mod:`refork.serving.wsgi.http2`.
"""

from __future__ import annotations

from typing import Protocol

from refork.config import Config
from refork.http.budget import Charged
from refork.http.h2 import PREFACE, ConnectionEnded, ErrorCodes, Http2Connection, Http2Limits
from refork.http.response import reason_phrase
from refork.serving.connection import Expiry, Phase, Timeouts

__all__ = [
    "LINGER", "alpn_protocols", "answer_here", "charge_held", "end_if_body_overdue",
    "http2_limits", "sniff_preface",
]  # fmt: skip

LINGER = 1.0  # seconds a closed connection still reads (and drops) what its client sends

_HEALTH_BODIES = {200: b"ok\n", 503: b"unavailable\n"}  # (refork.serving.health's, over HTTP/1.1)


def http2_limits(config: Config) -> Http2Limits:
    """The connection's limits from the settings (refork.http knows no Config)."""
    return Http2Limits(
        max_concurrent_streams=config.http2_max_concurrent_streams,
        initial_window_size=config.http2_initial_window_size,
        max_frame_size=config.http2_max_frame_size,
        max_header_list_size=config.http2_max_header_list_size,
        max_request_line=config.limit_request_line,
        max_fields=config.limit_request_fields,
        max_field_size=config.limit_request_field_size,
        max_body=config.limit_request_body,
    )


def alpn_protocols(config: Config) -> list[str]:
    """What ALPN offers on TLS listeners, in --http-protocols' order (h2c is cleartext's)."""
    names = {"h2": "h2", "h1": "http/1.1"}
    offered = [names[p] for p in config.http_protocols if p in names]
    return offered or ["http/1.1"]


def sniff_preface(seen: bytes) -> bool | None:
    """Whether a cleartext connection's first bytes are the HTTP/2 preface: True, False, or None
    while they are a beginning of it (wait for more)."""
    if seen.startswith(PREFACE):
        return True
    return None if PREFACE.startswith(seen) else False


def answer_here(h2: Http2Connection, sid: int, status: int, head_only: bool = False, health: bool = False
                ) -> None:  # fmt: skip
    """A request answered by refork, never by the app: refused by a limit (413, 414, 431, 408), or
    a --health-path check (200 or 503); the rest of its body is not wanted (RST_STREAM NO_ERROR)."""
    body = _HEALTH_BODIES[status] if health else b"%d %s\n" % (status, reason_phrase(status))
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body)),
               (b"cache-control", b"no-store")]  # fmt: skip
    h2.respond(sid, status, headers, end_stream=head_only)
    if not head_only:
        h2.send_body(sid, memoryview(body), True)
    h2.reset(sid, 0)


class Receiving(Protocol):
    """What the body deadline reads and writes of a stream (both loops' streams have it)."""

    sid: int
    opened_at: float  # the head's arrival: the body deadline runs from it
    received: int  # body bytes so far
    head_out: bool
    status: int


def end_if_body_overdue(h2: Http2Connection, stream: Receiving, now: float, timeouts: Timeouts) -> bool:
    """A body that does not arrive in time: 408 on its stream, or a reset once the response has
    started; the stream pays, not the connection. True when it was ended (the caller lets it go)."""
    verdict = timeouts.expiry(Phase.BODY, stream.opened_at, now, 0.0, stream.received, False)
    if verdict is not Expiry.REQUEST_TIMEOUT:
        return False
    if not stream.head_out:
        stream.head_out, stream.status = True, 408
        answer_here(h2, stream.sid, 408)
    else:
        h2.reset(stream.sid, ErrorCodes.CANCEL)
    return True


def charge_held(h2: Http2Connection, memory: Charged, held: int) -> tuple[int, ConnectionEnded | None]:
    """Charge what h2 holds of the client's bytes now (a header block not ended, a frame not
    whole), `held` of them charged before, to the worker's --max-request-memory: a header block
    that does not fit ends the connection (GOAWAY ENHANCE_YOUR_CALM; HPACK's shared state rules
    out refusing only its stream), as HTTP/1.1 answers such a head 503; other bytes are charged
    all the same. (what is charged now, the end to handle if it came to that)"""
    now = h2.buffered
    more = now - held
    if more > 0 and not memory.take(more):
        if h2.head_arriving:
            return held, h2.overloaded("no room for more request heads (--max-request-memory)")
        memory.charge(more)
    elif more < 0:
        memory.give_back(-more)
    return now, None
