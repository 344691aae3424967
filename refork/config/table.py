"""The settings table: the Config dataclass, one field per setting, each declared once with setting().

A field's setting() carries its flags, help, --help group, coercer and whether HUP may change it;
argparse, loading and validation from every source, --print-config, RESTART_ONLY and the options
table in docs/configuration.md are all derived from these declarations (see refork.config.load and
refork.config.docs). Modes are Literal types: their allowed values are read from the type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from refork.config import coercers as c
from refork.config.settings import Setting, setting, settings_of
from refork.integrations import NAMES

Interface = Literal["auto", "wsgi", "asgi"]
Loop = Literal["auto", "asyncio", "uvloop"]
WsgiLoop = Literal["auto", "native", "python"]
WebSockets = Literal["auto", "wsproto", "none"]
_TWENTY_SECONDS: float | None = 20.0  # typed so setting() infers the optional type of its coercer
AccessLogFormat = Literal["common", "combined", "json"]
LogLevel = Literal["debug", "info", "warning", "error", "critical"]
ForkSafety = Literal["warn", "strict", "off"]
MemoryMetric = Literal["uss", "pss"]
Allocator = Literal["system", "jemalloc"]
ReadyWhen = Literal["warm", "started"]


@dataclass
class Config:
    # What to serve
    app: str = setting(
        "", "APP", coerce=c.string, help="module:app, module:factory() or module (uses app/application)"
    )
    interface: Interface = setting(
        "auto",
        "--interface",
        coerce=c.Choice(Interface),
        help="app interface (default: detect)",
        doc="`auto` detects coroutine callables as ASGI 3",
        group="app",
    )
    chdir: str | None = setting(
        None,
        "--chdir",
        coerce=c.optional_string,
        metavar="DIR",
        help="change to DIR before loading the app",
        group="app",
        restart_only=True,
    )
    pythonpath: list[str] = setting(
        [],
        "--pythonpath",
        coerce=c.list_of(c.string),
        action="append",
        metavar="DIRS",
        help="comma-separated dirs to add to sys.path",
        group="app",
    )
    root_path: str = setting(
        "",
        "--root-path",
        coerce=c.root_path,
        metavar="PATH",
        help="SCRIPT_NAME / ASGI root_path for an app mounted below /",
        group="app",
    )

    # Sockets
    bind: list[str] = setting(
        ["127.0.0.1:8000"],
        "-b",
        "--bind",
        coerce=c.list_of(c.bind_address, split_items=False),
        action="append",
        metavar="ADDR",
        help="HOST:PORT, [V6]:PORT, :PORT, unix:PATH, fd://N",
        doc="`HOST:PORT`, `[V6]:PORT`, `:PORT`, `unix:PATH`, `fd://N` (a socket passed by the parent)",
        group="server",
        restart_only=True,
    )
    backlog: int = setting(
        2048,
        "--backlog",
        coerce=c.integer(1),
        metavar="N",
        help="listen() backlog",
        doc="`listen()` backlog",
        group="server",
        restart_only=True,
    )
    forwarded_allow_ips: list[str] = setting(
        ["127.0.0.1", "::1", "unix:"],
        "--forwarded-allow-ips",
        coerce=c.list_of(c.trusted_proxy),
        metavar="IPS",
        help="comma-separated proxies trusted for X-Forwarded-*",
        doc="proxies (addresses or networks like `10.0.0.0/8`) whose `X-Forwarded-Proto/For` are trusted "
        "(`unix:` = unix-socket peers, `*` = all)",
        group="server",
    )

    # Processes
    workers: int = setting(
        1,
        "-w",
        "--workers",
        coerce=c.workers,
        metavar="N|auto",
        help="worker processes (auto: CPU quota)",
        doc="worker processes; `auto` = the cgroup CPU quota (or the CPU count); also read from "
        "`WEB_CONCURRENCY`",
        group="server",
    )
    threads: int = setting(
        1,
        "--threads",
        coerce=c.integer(1),
        metavar="N",
        help="threads per WSGI worker",
        doc="WSGI threads per worker (1 = the app runs on the I/O loop thread)",
        group="server",
    )
    timeout: float = setting(
        30.0,
        "--timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="kill a worker whose app holds a request longer than this (client I/O not counted)",
        doc="a worker whose app holds a request longer than this is killed and replaced; time "
        "waiting on the client (a slow body, a slow reader) is not counted: the body and write "
        "timeouts bound it per connection",
        group="server",
    )
    graceful_timeout: float = setting(
        30.0,
        "--graceful-timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="time to finish in-flight requests on stop",
        doc="how long a stopping worker may finish in-flight requests",
        group="server",
    )
    request_timeout: float | None = setting(
        None,
        "--request-timeout",
        coerce=c.off_or_seconds,
        metavar="S|off",
        help="soft per-request timeout: log the request's stack and replace its worker gracefully",
        doc="a request in the app longer than this (soft; `refork.extend_deadline()` pushes it for one "
        "request) is logged once with its method, path, duration and Python stack; its worker stops "
        "accepting, finishes its other requests (within `--graceful-timeout`) and goes once a "
        "replacement from the mold is ready. `--timeout` stays the hard kill (see docs/timeouts.md)",
        shown_default="off",
        group="server",
    )
    # Health, readiness and shutdown (docs/deploy.md)
    health_path: str = setting(
        "",
        "--health-path",
        coerce=c.health_path,
        metavar="PATH",
        help="answer health checks at PATH (liveness), PATH/live and PATH/ready, without the app",
        doc="the worker's loop answers `GET PATH` and `PATH/live` (200 while it serves) and `PATH/ready` "
        "(200 once ready, 503 before and while the server drains) without calling the app; not in the "
        "access log",
        shown_default="off",
        group="server",
    )
    ready_when: ReadyWhen = setting(
        "warm",
        "--ready-when",
        coerce=c.Choice(ReadyWhen),
        help="when readiness (PATH/ready, systemd READY=1) turns on",
        doc="`warm`: the first mold is warm and all `--workers` of its generation are up; `started`: the "
        "first worker serves",
        group="server",
    )
    shutdown_delay: float = setting(
        0.0,
        "--shutdown-delay",
        coerce=c.non_negative_float,
        metavar="S",
        help="on TERM, keep serving S seconds with readiness failing before stopping",
        doc="on `TERM`, keep serving this long with readiness failing (so a load balancer stops routing "
        "here) before the graceful stop; a second `TERM` or an `INT` stops at once",
        group="server",
    )
    keepalive: float = setting(
        5.0,
        "--keepalive",
        coerce=c.positive_seconds,
        metavar="S",
        help="idle keep-alive connection timeout",
        doc="idle keep-alive connections are closed after this",
        group="server",
    )
    header_timeout: float = setting(
        10.0,
        "--header-timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="time allowed to receive a request head",
        doc="a client must send a complete request head within this (slowloris)",
        group="server",
    )
    body_timeout: float = setting(
        30.0,
        "--body-timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="time allowed to receive a request body, counted from the end of its head "
        "(extended by --body-min-rate)",
        doc="a client must send the whole request body within this, counted from the end of the head, "
        "plus one second per `--body-min-rate` bytes received (a total, so a trickle does not "
        "re-arm it, yet a big upload at an honest rate is never cut); answered 408. Not part "
        "of `--timeout`, which counts time in the app only",
        group="server",
    )
    body_min_rate: float = setting(
        500.0,
        "--body-min-rate",
        coerce=c.non_negative_float,
        metavar="BYTES",
        help="body bytes per second that each extend --body-timeout by a second (0: no extension)",
        doc="each this many request-body bytes received extend `--body-timeout` by a second "
        "(Apache mod_reqtimeout's `MinRate`): an upload faster than this on average is never cut; "
        "0 makes `--body-timeout` a flat total",
        group="server",
    )
    write_timeout: float = setting(
        30.0,
        "--write-timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="cut a connection whose response makes no progress for this long",
        doc="a client that stops reading its response is cut after this long without progress "
        "(a slow but steady reader never is); logged as a warning naming the client and request. "
        "Not part of `--timeout`, which counts time in the app only",
        group="server",
    )
    spawn_timeout: float = setting(
        10.0,
        "--spawn-timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="time a new worker or mold has to report in",
        doc="a new worker or promoted mold must report in within this, or it is killed",
        group="server",
    )
    max_requests: int = setting(
        0,
        "--max-requests",
        coerce=c.integer(0),
        metavar="N",
        help="restart a worker after N requests (0: never)",
        doc="recycle a worker after N requests (0: never); the replacement is ready first",
        group="server",
    )
    max_requests_jitter: int = setting(
        0,
        "--max-requests-jitter",
        coerce=c.integer(0),
        metavar="N",
        help="random extra requests added to --max-requests",
        group="server",
    )
    proc_name: str = setting(
        "refork",
        "-n",
        "--name",
        coerce=c.nonempty_string,
        metavar="NAME",
        help="process title prefix",
        doc="process titles and the default control socket name",
        group="server",
        restart_only=True,
    )
    control_socket: str | None = setting(
        None,
        "--control-socket",
        coerce=c.optional_string,
        metavar="PATH",
        help="unix socket for `refork status`",
        doc="what `refork status` talks to; `off` disables; a location another user owns or can replace is "
        "refused at start",
        shown_default="`$XDG_RUNTIME_DIR/NAME.ctl` or `/tmp/refork-UID/NAME.ctl`",
        group="server",
        restart_only=True,
    )
    pidfile: str | None = setting(
        None,
        "-p",
        "--pid",
        coerce=c.optional_string,
        metavar="FILE",
        help="write the monitor's pid to FILE",
        doc="the monitor's pid, for init scripts and `kill -HUP $(cat FILE)`; written atomically, refused "
        "while a live process holds it, replaced when stale, removed on exit; relative to where refork "
        "started",
        group="server",
        restart_only=True,
    )
    loop: Loop = setting("auto", "--loop", coerce=c.Choice(Loop), help="ASGI event loop", group="server")
    wsgi_loop: WsgiLoop = setting(
        "auto",
        "--wsgi-loop",
        coerce=c.Choice(WsgiLoop),
        help="WSGI connection loop",
        doc="`native` does the per-request work in Rust (refork._native: head parsing, environ, "
        "response framing), `python` is pure Python; `auto` picks native where the extension is built "
        "(docs/native.md)",
        group="server",
    )

    # WebSockets (ASGI apps; refork.serving.aio_websocket; docs/websockets.md)
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
    ws_max_queue: int = setting(
        32,
        "--ws-max-queue",
        coerce=c.integer(1),
        metavar="N",
        help="incoming messages buffered before reading pauses",
        doc="incoming messages waiting for the app's `receive()`; past it, refork stops reading the "
        "socket (TCP backpressure on the client)",
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

    # TLS (refork.serving.tls; docs/tls.md): HUP re-reads the files, a new generation serves them
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
        "module's. TLS 1.2 is the minimum version; ALPN offers `http/1.1`",
        group="tls",
    )
    ssl_handshake_timeout: float = setting(
        10.0,
        "--ssl-handshake-timeout",
        coerce=c.positive_seconds,
        metavar="S",
        help="time allowed for a TLS handshake",
        doc="a client must finish the TLS handshake within this, or it is closed (logged at debug); "
        "`--header-timeout` then runs for the request head. ASGI on 3.11+: also the wait for a "
        "client's close_notify once the server closed",
        group="tls",
    )

    # HTTP limits
    limit_request_line: int = setting(
        8190,
        "--limit-request-line",
        coerce=c.integer(1),
        metavar="N",
        help="max request line bytes",
        doc="max request line bytes (414 above)",
        group="HTTP limits",
    )
    limit_request_fields: int = setting(
        100,
        "--limit-request-fields",
        coerce=c.integer(1),
        metavar="N",
        help="max header count",
        doc="max header count (431 above)",
        group="HTTP limits",
    )
    limit_request_field_size: int = setting(
        8190,
        "--limit-request-field-size",
        coerce=c.integer(1),
        metavar="N",
        help="max header line bytes",
        doc="max header line bytes (431 above)",
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

    # Logging
    access_logfile: str | None = setting(
        None,
        "--access-logfile",
        coerce=c.optional_string,
        metavar="FILE",
        help="access log file ('-': stdout; default: off)",
        doc="access log file (`-` = stdout)",
        shown_default="off",
        group="logging",
    )
    access_log_format: AccessLogFormat = setting(
        "common",
        "--access-log-format",
        coerce=c.Choice(AccessLogFormat),
        help="access log format",
        group="logging",
    )
    error_logfile: str = setting(
        "-",
        "--error-logfile",
        coerce=c.nonempty_string,
        metavar="FILE",
        help="error log file ('-': stderr)",
        doc="error log file (`-` = stderr)",
        group="logging",
    )
    log_level: LogLevel = setting(
        "info",
        "--log-level",
        coerce=c.Choice(LogLevel),
        metavar="LEVEL",
        help="debug, info, warning, error or critical",
        group="logging",
    )

    # Memory (see docs/memory.md)
    immortalize: bool = setting(
        True,
        "--immortalize",
        coerce=c.boolean,
        action="boolean_optional",
        help="immortalize the heap before fork",
        doc="immortalize the mold's heap before fork (CPython 3.12+) so workers do not copy its pages",
        group="memory",
    )
    warmup: list[str] = setting(
        [],
        "--warmup",
        coerce=c.list_of(c.url_path, split_items=False),
        action="append",
        metavar="PATH",
        help="request path sent through the app before fork",
        doc="request path sent through the app in the mold before the first fork",
        group="memory",
    )
    refork_after: list[int] | None = setting(
        None,
        "--refork-after",
        coerce=c.refork_after,
        metavar="N,N,...|off",
        help="requests per generation before promoting a new mold",
        doc="requests per generation before a worker is promoted to be the next mold (the last count "
        "repeats unless the list ends in `off`)",
        shown_default="off",
        group="memory",
    )
    refork_max_unavailable: int | None = setting(
        None,
        "--refork-max-unavailable",
        coerce=c.auto_or_positive_int,
        metavar="N",
        help="workers replaced at once during a refork",
        shown_default="10% of the workers, rounded up",
        group="memory",
    )
    mold_idle_exit: float | None = setting(
        None,
        "--mold-idle-exit",
        coerce=c.off_or_seconds,
        metavar="S|off",
        help="stop the mold after S idle seconds to free its memory; a worker is promoted when needed",
        shown_default="off",
        group="memory",
    )
    fork_safety: ForkSafety = setting(
        "warn",
        "--fork-safety",
        coerce=c.Choice(ForkSafety),
        help="connections or threads alive at fork: log them (warn) or refuse to fork (strict)",
        doc="connections and threads alive when a mold forks: log them with the line that made them "
        "(warn), or refuse to fork (strict); see [fork-safety.md](fork-safety.md)",
        group="memory",
    )
    fork_integrations: list[str] = setting(
        list(NAMES),
        "--fork-integrations",
        coerce=c.fork_integrations,
        metavar="NAME,...|all|none",
        help="built-in fork fixes for the libraries the app imports (django, sqlalchemy, redis, ...)",
        doc="built-in fork fixes, each active only when the app imports its library: "
        + ", ".join(f"`{name}`" for name in NAMES)
        + "; `all` or `none`; see [fork-safety.md](fork-safety.md)",
        shown_default="all",
        group="memory",
    )
    max_worker_memory: int = setting(
        0,
        "--max-worker-memory",
        coerce=c.size,
        metavar="SIZE",
        help="replace a worker above this, e.g. 512M (0: off)",
        group="memory",
    )
    memory_metric: MemoryMetric = setting(
        "uss",
        "--memory-metric",
        coerce=c.Choice(MemoryMetric),
        help="what --max-worker-memory measures",
        group="memory",
    )
    memory_interval: float = setting(
        10.0,
        "--memory-interval",
        coerce=c.positive_seconds,
        metavar="S",
        help="seconds between memory samples",
        doc="seconds between memory samples (`smaps_rollup`) of each process",
        group="memory",
    )
    allocator: Allocator = setting(
        "system",
        "--allocator",
        coerce=c.Choice(Allocator),
        help="malloc implementation",
        group="memory",
        restart_only=True,
    )
    malloc_trim: bool = setting(
        False,
        "--malloc-trim",
        coerce=c.boolean,
        action="boolean_optional",
        help="malloc_trim() when idle (10 s apart)",
        group="memory",
    )
    memray: str | None = setting(
        None,
        "--memray",
        coerce=c.optional_string,
        metavar="DIR",
        help="write one memray capture per worker to DIR",
        group="memory",
    )

    # Metrics (docs/metrics.md)
    metrics_bind: str | None = setting(
        None,
        "--metrics-bind",
        coerce=c.optional_bind_address,
        metavar="ADDR",
        help="serve Prometheus GET /metrics here (the monitor; off by default)",
        doc="serve Prometheus `GET /metrics` on this address, from the monitor (same syntax as "
        "`--bind`; never the app's port); off by default",
        group="metrics",
        restart_only=True,
    )
    metrics_buckets: list[float] = setting(
        [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
        "--metrics-buckets",
        coerce=c.histogram_buckets,
        metavar="S,S,...",
        help="request duration histogram bounds, seconds",
        doc="upper bounds (seconds, ascending, at most 39) of the request duration histograms",
        shown_default="Prometheus' defaults, `0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10`",
        group="metrics",
        restart_only=True,
    )

    # Hooks (from the config file only): callables named like gunicorn's; not a setting
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)

    # Modes
    check_config: bool = setting(
        False,
        "--check-config",
        coerce=c.boolean,
        action="store_true",
        help="load the app, check fork safety, exit",
        doc="import and warm the app as a mold would, check fork safety, say WSGI or ASGI, exit",
    )
    print_config: bool = setting(
        False,
        "--print-config",
        coerce=c.boolean,
        action="store_true",
        help="print the resolved config and exit",
        doc="print the resolved config as `name = value` lines and exit",
    )
    reload: bool = setting(
        False,
        "--reload",
        coerce=c.boolean,
        action="store_true",
        help="development: reload when a *.py file changes",
        doc="development: reload (as on `HUP`) when a watched `*.py` file changes",
        restart_only=True,
    )
    reload_dirs: list[str] = setting(
        [],
        "--reload-dir",
        coerce=c.list_of(c.nonempty_string),
        action="append",
        metavar="DIR",
        help="watch DIR (default: cwd)",
        doc="a directory `--reload` watches, relative to where refork started",
        shown_default="the working directory and `--pythonpath`",
        restart_only=True,
    )


SETTINGS: tuple[Setting[Any], ...] = settings_of(Config)
"""Every setting, in field order: all Config fields but ``hooks``."""

_BY_NAME: dict[str, Setting[Any]] = {s.name: s for s in SETTINGS}

RESTART_ONLY: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.restart_only)
"""Settings the monitor holds for its whole life (sockets, cwd, title, malloc): HUP keeps them."""

HOOK_NAMES = (
    "on_starting",  # monitor, before the first mold: (config)
    "when_ready",  # monitor, after the first workers are ready: (config)
    "pre_fork",  # mold, before forking a worker: (config)
    "post_fork",  # worker, right after fork: (config, worker_info)
    "post_worker_init",  # worker, when ready to serve: (config, worker_info)
    "warmup",  # mold, after the app is imported and before the first fork: (app)
    "pre_promotion",  # worker, before it forks a new mold (close connections here): (config, worker_info)
    "worker_exit",  # worker, before it exits: (config, worker_info)
    "child_exit",  # monitor, after a child was reaped: (config, child_info)
    "on_reload",  # monitor, on HUP once the config was re-read: (config)
    "on_exit",  # monitor, before exit: (config)
)


def setting_named(name: str) -> Setting[Any]:
    """The table row of one setting (its flags, default, env name...), for commands that reuse it."""
    return _BY_NAME[name]
