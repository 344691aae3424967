"""The Python loop's native parts, used when an engine host owns it (:data:`NATIVE`).

refork._native (Rust: PyO3 + httparse, built from native/ by ``pip install``) serves WSGI through
its engines: :mod:`refork.serving.wsgi.engine_host` with one app thread,
:mod:`refork.serving.wsgi.pool_host` with a pool of them. Each hands the connections it does not
serve to the Python loop it owns (:mod:`refork.serving.wsgi.python_loop`), built with these
parts: refork._native.Parser, which parses the common shape with httparse and hands any other
message (an unusual method or target, chunked, Expect, Upgrade, a head split across reads, an
error) from its first byte to the Python parser (:mod:`refork.http.parser`), so every rejection,
limit and status code is the Python parser's, by construction; the native environ and response
framing; the native memory budget, shared with the engine. Everything else (accept, timeouts, the
drain, safe points, TLS, the access log) is the Python loop's, unchanged: both loops pass the
same tests.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from refork import _native
from refork.http.body import InputStream
from refork.http.events import Request
from refork.http.parser import Limits
from refork.http.response import ResponseFramer
from refork.serving.outbox import Outbox
from refork.serving.parsers import native_parser
from refork.serving.tls_io import TlsConn
from refork.serving.wsgi.conn import Conn, LoopParts
from refork.wsgi import EnvironBuilder, Outcome, Output, Streaming
from refork.wsgi.response import _Exchange, start_wsgi


def native_environ(builder: EnvironBuilder) -> _native.Environ | None:
    """A refork._native.Environ for this builder's settings; None where it cannot stand in (a
    root path beyond latin-1; a secure scheme header not named X-Forwarded-*, which its fast path
    does not look for): the Python loop serves that listener."""
    if builder.other_secure_headers:
        return None
    try:
        return _native.Environ(base=builder.base, root_path=builder.root_path, url_scheme=builder.url_scheme,
                               server_name=builder.server_name, server_port=builder.server_port,
                               apply_forwarded=builder.apply_forwarded)  # fmt: skip
    except ValueError:
        return None


class NativeEnvironBuilder(EnvironBuilder):
    """EnvironBuilder whose build() is refork._native.Environ (with X-Forwarded-* fields, it calls
    back apply_forwarded: the trusted-proxy rules are this class's)."""

    native: _native.Environ

    @classmethod
    def like(cls, builder: EnvironBuilder) -> EnvironBuilder:
        """The same builder (same base dict, caches, proxies) with the native build()."""
        native = native_environ(builder)
        if native is None:
            return builder
        new = cls.__new__(cls)
        new.__dict__.update(builder.__dict__)
        new.native = native
        return new

    def build(self, request: Request, body: InputStream, client: tuple[str, int] | None) -> dict[str, Any]:
        env: dict[str, Any] = self.native.build(request, body, client)
        return env


def _frame_natively(ex: _Exchange, framer: ResponseFramer, result: Any, request: Request) -> bool:
    """A list/tuple body of bytes up to 64 KiB framed by refork._native.frame_list (the head, the
    Date line cached per second, the body: one write); False where it declines, before sending."""
    kind = type(result)
    if not ((kind is list or kind is tuple) and ex.code and not ex.head_sent):
        return False
    framed = _native.frame_list(ex, framer, result)
    if framed is None:
        return False
    data, framer.body_bytes, framer.keep_alive = framed
    ex.head_sent = True
    ex.send(data)
    return True


def start_wsgi_native(
    app: Callable[..., Any],
    environ: dict[str, Any],
    request: Request,
    out: Output,
    keep_alive: bool = True,
    frame: Callable[[_Exchange, ResponseFramer, Any, Request], bool] | None = _frame_natively,
) -> Outcome | Streaming:
    """refork.wsgi.start_wsgi with the common response framed natively (:func:`_frame_natively`).
    Everything else, and any case frame_list declines, is start_wsgi's own path: nothing is sent
    before that decision, so the bytes on the wire are the same either way."""
    return start_wsgi(app, environ, request, out, keep_alive, frame)


class NativeConn(Conn):
    """A Conn whose parser is refork._native.Parser."""

    __slots__ = ()

    def __init__(self, sock: socket.socket, client: Any, builder: EnvironBuilder, limits: Limits,
                 out: Outbox, tls: TlsConn | None = None) -> None:  # fmt: skip
        super().__init__(sock, client, builder, limits, out, tls)
        # (RequestParser's contract, not its class: the parity tests of tests/serving/test_native_loop.py)
        self.parser = native_parser(limits)  # type: ignore[assignment]


def native_memory(limit: int) -> Any:
    """The worker's budget of request bytes held: refork._native.MemoryBudget, shared with the
    engine's threads (see Intake in native/src/conn/intake.rs); the Python one's interface."""
    return _native.MemoryBudget(limit)


# The Python loop's parts when an engine host owns it (refork.serving.wsgi.conn.LoopParts)
NATIVE = LoopParts(NativeConn, start_wsgi_native, NativeEnvironBuilder.like, native_memory)

