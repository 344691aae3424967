"""The settings of the protocols spoken on a connection: WebSockets, TLS and the HTTP limits.

Part of the one settings table (refork.config.table.Config inherits these fields); see there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import refork.config.coercers as c
from refork.config.settings import setting

WebSockets = Literal["auto", "wsproto", "none"]
_TWENTY_SECONDS: float | None = 20.0  # typed so setting() infers the optional type of its coercer


@dataclass
class ProtocolSettings:
    # WebSockets (ASGI apps; refork.serving.asgi.websocket_protocol; docs/websockets.md)
    ws: WebSockets = setting(
        "auto",
        "--ws",
        coerce=c.Choice(WebSockets),
        help="WebSocket protocol for ASGI apps",
        doc="`auto` and `wsproto` serve WebSockets with wsproto; `none` answers an upgrade like any "
        "HTTP request",
        group="websockets",
    )
    ws_max_size: int = setting(
        16 << 20,
        "--ws-max-size",
        coerce=c.size,
        metavar="SIZE",
        help="largest incoming WebSocket message, e.g. 1M",
        doc="largest incoming WebSocket message (after decompression); bigger closes with 1009",
        shown_default="`16M`",
        group="websockets",
    )
    ws_per_message_deflate: bool = setting(
        True,
        "--ws-per-message-deflate",
        coerce=c.boolean,
        action="boolean_optional",
        help="offer permessage-deflate compression",
        doc="accept the permessage-deflate extension (RFC 7692) when the client offers it",
        group="websockets",
    )
    ws_ping_interval: float | None = setting(
        _TWENTY_SECONDS,
        "--ws-ping-interval",
        coerce=c.off_or_seconds,
        metavar="S",
        help='seconds between keep-alive pings ("off": none)',
        group="websockets",
    )
    ws_ping_timeout: float | None = setting(
        _TWENTY_SECONDS,
        "--ws-ping-timeout",
        coerce=c.off_or_seconds,
        metavar="S",
        help='close (1011) when a ping is not answered within S ("off": never)',
        group="websockets",
    )
    ws_drain_timeout: float = setting(
        300.0,
        "--ws-drain-timeout",
        coerce=c.non_negative_seconds,
        metavar="S",
        help="seconds a retiring worker keeps serving its open WebSockets (0: close at once)",
        doc="how long a worker retired because a replacement serves (a refork, `--max-requests`, "
        "`--max-worker-memory`) keeps serving its open WebSockets while it accepts nothing new; "
        "those still open then get 1012 (service restart). A stop (TERM) closes them with 1001 "
        "within `--graceful-timeout`, a reload (HUP) with 1012 at once",
        group="websockets",
    )
    ws_max_queue: int = setting(
        32,
        "--ws-max-queue",
        coerce=c.integer(1),
        metavar="N",
        help="incoming messages buffered before reading pauses",
        doc="incoming messages waiting for the app's `receive()`; past it (or once they and the message "
        "arriving hold `--ws-max-size` bytes), refork stops reading the socket (TCP backpressure on "
        "the client)",
        group="websockets",
    )
    ws_max_memory: int = setting(
        64 << 20,
        "--ws-max-memory",
        coerce=c.size,
        metavar="SIZE",
        help="per worker: incoming WebSocket bytes held for the apps (0: no cap)",
        doc="per worker: bytes of incoming WebSocket messages all its connections hold for their apps "
        "(waiting for `receive()`, or partly received), counted after decompression; past it a "
        "connection stops reading (TCP backpressure) until an app takes a message, and one partway "
        "through a message when no app has one to take is closed with 1009 (0: no cap). Each connection "
        "holds at most `--ws-max-size` of it: the default is four such connections",
        shown_default="`64M`",
        group="websockets",
    )
    ws_write_limit: int = setting(
        64 << 10,
        "--ws-write-limit",
        coerce=c.size,
        metavar="SIZE",
        help="unsent outgoing bytes before the app's send() waits",
        doc="outgoing bytes a slow client may leave unread; past it the app's `send()` waits until "
        "the client reads (the write timeout still applies)",
        shown_default="`64K`",
        group="websockets",
    )

    # TLS (refork.serving.tls_context; docs/tls.md): HUP re-reads the files, a new generation serves them
    certfile: str | None = setting(
        None,
        "--certfile",
        coerce=c.optional_string,
        metavar="FILE",
        help="serve TLS with this PEM certificate (chain) on every TCP listener",
        doc="PEM certificate (with its chain, and the key if `--keyfile` is not given); turns TLS on for "
        "every TCP listener (unix sockets stay plain); the files are read by the monitor at start and "
        "on HUP, which starts a generation that serves the new ones",
        group="tls",
    )
    keyfile: str | None = setting(
        None,
        "--keyfile",
        coerce=c.optional_string,
        metavar="FILE",
        help="PEM private key of --certfile",
        doc="PEM private key of `--certfile` (checked against it at start: a mismatch is exit 2)",
        group="tls",
    )
    keyfile_password: str | None = setting(
        None,
        "--keyfile-password",
        coerce=c.optional_string,
        metavar="TEXT",
        help="password of an encrypted --keyfile (prefer REFORK_KEYFILE_PASSWORD)",
        doc="password of an encrypted `--keyfile`; prefer the environment variable to the command line",
        group="tls",
    )
    ca_certs: str | None = setting(
        None,
        "--ca-certs",
        coerce=c.optional_string,
        metavar="FILE",
        help="PEM CA certificates client certificates are checked against (mTLS)",
        doc="PEM CA certificates that client certificates must chain to (needed by `--cert-reqs` 1 or 2)",
        group="tls",
    )
    cert_reqs: int = setting(
        0,
        "--cert-reqs",
        coerce=c.cert_reqs,
        metavar="0|1|2",
        help="client certificate: 0/none, 1/optional, 2/required",
        doc="whether a client certificate is asked for: `0`/`none`, `1`/`optional` (checked if sent), "
        "`2`/`required` (mTLS); gunicorn's numbers or the names",
        group="tls",
    )
    ciphers: str | None = setting(
        None,
        "--ciphers",
        coerce=c.optional_string,
        metavar="LIST",
        help="OpenSSL cipher list for TLS 1.2 (default: Python's)",
        doc="OpenSSL cipher string for TLS 1.2 (TLS 1.3 suites are OpenSSL's); default: the `ssl` "
        "module's. TLS 1.2 is the minimum version; ALPN offers what `--http-protocols` lists",
        group="tls",
    )
    ssl_handshake_timeout: float = setting(
        10.0,
        "--ssl-handshake-timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="time allowed for a TLS handshake",
        doc="a client must finish the TLS handshake within this, or it is closed (logged at debug); "
        "`--header-timeout` then runs for the request head. ASGI (uvloop, or asyncio on 3.11+): the "
        "wait for a client's close_notify once the server closed is the smaller of this and 1 s "
        "(docs/tls.md)",
        group="tls",
    )

    # HTTP/2 (refork.http.h2, refork.serving.asgi.http2_protocol, refork.serving.wsgi.http2; docs/http2.md)
    http_protocols: list[str] = setting(
        ["h2", "h1"],
        "--http-protocols",
        coerce=c.http_protocols,
        metavar="LIST",
        help="protocols served, in preference order: h1, h2 (TLS, by ALPN), h2c (cleartext)",
        doc="comma list in preference order: `h1` (HTTP/1.1), `h2` (HTTP/2 on TLS listeners, picked by "
        "ALPN), `h2c` (HTTP/2 on cleartext listeners, for a client that opens with the HTTP/2 preface, "
        "e.g. a load balancer); WSGI and ASGI workers alike",
        shown_default="`h2,h1`",
        group="HTTP/2",
    )
    http2_max_concurrent_streams: int = setting(
        100,
        "--http2-max-concurrent-streams",
        coerce=c.integer(1),
        metavar="N",
        help="streams a client may have open on one HTTP/2 connection",
        doc="streams one HTTP/2 connection may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS); "
        "a client that opens more ends its connection (GOAWAY PROTOCOL_ERROR)",
        group="HTTP/2",
    )
    http2_initial_window_size: int = setting(
        65535,
        "--http2-initial-window-size",
        coerce=c.http2_window,
        metavar="BYTES",
        help="request body bytes a stream may send before the app reads them",
        doc="each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE): request body bytes a client "
        "may send ahead of the app's `receive()`; the window reopens as the app reads",
        group="HTTP/2",
    )
    http2_max_frame_size: int = setting(
        16384,
        "--http2-max-frame-size",
        coerce=c.http2_frame_size,
        metavar="BYTES",
        help="largest HTTP/2 frame payload accepted",
        doc="largest frame payload a client may send (SETTINGS_MAX_FRAME_SIZE, 16384 to 16777215)",
        group="HTTP/2",
    )
    http2_max_header_list_size: int = setting(
        65536,
        "--http2-max-header-list-size",
        coerce=c.limit(1 << 20),
        metavar="BYTES",
        help="largest decoded header list of one HTTP/2 request (0: 1M)",
        doc="largest header list of one request after HPACK decoding (SETTINGS_MAX_HEADER_LIST_SIZE), "
        "checked while it is decoded and while CONTINUATION frames arrive; each header is also held "
        "to `--limit-request-field-size` and their count to `--limit-request-fields` (431)",
        group="HTTP/2",
    )

    # HTTP limits
    limit_request_line: int = setting(
        8190,
        "--limit-request-line",
        coerce=c.limit(1 << 20),
        metavar="N",
        help="max request line bytes (0: 1M, gunicorn's no limit)",
        doc="max request line bytes (414 above); 0 = gunicorn's no limit, which is 1M",
        group="HTTP limits",
    )
    limit_request_fields: int = setting(
        100,
        "--limit-request-fields",
        coerce=c.limit(32768, 32768),
        metavar="N",
        help="max header count (0: 32768, gunicorn's most)",
        doc="max header count (431 above); 0 or more than 32768 = 32768, as in gunicorn",
        group="HTTP limits",
    )
    limit_request_field_size: int = setting(
        8190,
        "--limit-request-field_size",
        "--limit-request-field-size",
        coerce=c.limit(1 << 20),
        metavar="N",
        help="max header line bytes (0: 1M)",
        doc="max header line bytes (431 above); 0 = no limit of its own (1M, like a request line)",
        group="HTTP limits",
    )
    limit_request_body: int = setting(
        1 << 30,
        "--limit-request-body",
        coerce=c.size,
        metavar="SIZE",
        help="max body size, e.g. 100M (0: unlimited)",
        doc="max body size, e.g. `100M` (413 above; 0: unlimited)",
        shown_default="`1G`",
        group="HTTP limits",
    )
    body_spool_threshold: int = setting(
        1 << 20,
        "--body-spool-threshold",
        coerce=c.size,
        metavar="SIZE",
        help="request bodies larger than this go to a temporary file",
        shown_default="`1M`",
        group="HTTP limits",
    )
    max_request_memory: int = setting(
        16 << 20,
        "--max-request-memory",
        coerce=c.size,
        metavar="SIZE",
        help="per worker: bytes of requests still arriving held in memory (0: no cap)",
        doc="per worker: request bytes held in memory while they arrive, over all connections: "
        "partial heads, and bodies (WSGI: up to `--body-spool-threshold`, past it they go to the "
        "spool sooner; ASGI: not yet taken by `receive()`, past it reading waits); a head that does "
        "not fit gets 503 with `Retry-After` (0: no cap)",
        shown_default="`16M`",
        group="HTTP limits",
    )
    max_spool: int = setting(
        4 << 30,
        "--max-spool",
        coerce=c.size,
        metavar="SIZE",
        help="per worker: request body bytes spooled to temporary files at once (0: no cap)",
        doc="per worker: request body bytes held in spool files at once; a body bigger than this "
        "gets 413, one that does not fit beside the others 503 with `Retry-After` (0: no cap). "
        "The default is 4 times the default `--limit-request-body`: four maximal uploads per worker",
        shown_default="`4G`",
        group="HTTP limits",
    )
    spool_dir: str | None = setting(
        None,
        "--spool-dir",
        coerce=c.optional_string,
        metavar="DIR",
        help="directory for spooled request bodies (default: tempfile's, usually $TMPDIR or /tmp)",
        doc="where request bodies over `--body-spool-threshold` are spooled: unlinked temporary "
        "files, invisible to `du` but counted by `df`; default: Python's `tempfile.gettempdir()` "
        "(`$TMPDIR`, else `/tmp`)",
        group="HTTP limits",
    )
