"""The settings of what is served and how: the app, sockets, processes, timeouts, health, loops.

Part of the one settings table (refork.config.table.Config inherits these fields); see there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import refork.config.coercers as c
from refork.config.settings import setting

Interface = Literal["auto", "wsgi", "asgi"]
Loop = Literal["auto", "asyncio", "uvloop"]
ForwardedClient = Literal["auto", "on", "off"]
WsgiLoop = Literal["auto", "native", "python"]
ReadyWhen = Literal["warm", "started"]


@dataclass
class ServerSettings:
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
        doc="`HOST:PORT`, `[V6]:PORT`, `:PORT`, `unix:PATH` (`unix://PATH` too, as gunicorn reads it: "
        "`unix://tmp/a.sock` is `tmp/a.sock` under `--chdir`, `unix:///tmp/a.sock` is absolute), `fd://N` (a "
        "socket passed by the parent); `[::]:PORT` is dual-stack (IPv4 clients too), IPv6-only when an IPv4 "
        "address is bound on its port as well",
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
    forwarded_client: ForwardedClient = setting(
        "auto",
        "--forwarded-client",
        coerce=c.Choice(ForwardedClient),
        help="whether a trusted proxy's X-Forwarded-For names the client (auto: see the docs)",
        doc="`on`: a trusted proxy's `X-Forwarded-For` sets `REMOTE_ADDR` / `scope[\"client\"]` and the "
        "access log's `h` (the right-most entry that is not itself a trusted proxy), as uvicorn's "
        "`--proxy-headers`; `off`: they stay the peer and only the scheme is taken, as gunicorn does. "
        "`auto`: `off` when `--forwarded-allow-ips` is given (gunicorn's meaning of that setting) "
        "unless `-k` names a uvicorn worker (uvicorn's), else `on`; see "
        "[from-gunicorn.md](from-gunicorn.md#client-addresses)",
        group="server",
    )
    proxy_protocol: str = setting(
        "off",
        "--proxy-protocol",
        coerce=c.proxy_protocol,
        action="optional",
        metavar="off|v1|v2|auto",
        help="read HAProxy's PROXY protocol header at the start of each connection (the flag alone: auto)",
        doc="read the PROXY protocol header (HAProxy's v1 text, v2 binary, or `auto`: either) a proxy "
        "sends at the start of each connection, on every listener (before the TLS handshake on a TLS "
        "one): the client it names is `REMOTE_ADDR` / `scope[\"client\"]` and the access log's `h`. "
        "The flag alone means `auto`; `true`/`false` as in gunicorn; see [http.md](http.md#proxy-protocol)",
        group="server",
    )
    proxy_allow_ips: list[str] = setting(
        ["127.0.0.1", "::1"],
        "--proxy-allow-from",
        coerce=c.list_of(c.trusted_proxy),
        metavar="IPS",
        help="comma-separated proxies that may send a PROXY header ('*': any)",
        doc="the proxies (addresses or networks like `10.0.0.0/8`, `*` = any) that may send a PROXY "
        "header; a header from another peer is answered 403 and closed. Unix-socket peers always may "
        "(gunicorn's rule)",
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
    switch_interval: float | None = setting(
        None,
        "--switch-interval",
        coerce=c.default_or_positive_seconds,
        metavar="S",
        help="sys.setswitchinterval in each WSGI worker (try 0.02 for CPU-heavy pools)",
        doc="`sys.setswitchinterval` in each WSGI worker: how long a thread that wants the GIL waits "
        "before it forces the running one to let go. With `--threads` > 1 a longer interval (0.02) "
        "means fewer forced hand-offs between app threads and more requests a second, and longer "
        "waits for a thread that wakes from I/O (docs/native.md: measured both ways); `default` "
        "keeps the interpreter's (0.005, or what the app set at import)",
        shown_default="default",
        group="server",
    )
    timeout: float = setting(
        30.0,
        "-t",
        "--timeout",
        coerce=c.timeout_seconds,
        metavar="S",
        help="replace a worker whose app holds a request (ASGI: blocks its loop) longer than this, "
        "that request answered 500; 0: never",
        doc="a WSGI worker whose app holds a request longer than this is aborted and replaced, that "
        "request answered 500 if its response has not started, as in gunicorn (0 or `off`: never); time "
        "waiting on the client (a slow body, a slow reader) is not counted: the body and write "
        "timeouts bound it per connection. An ASGI worker is aborted so when its event loop is blocked "
        "in app code this long; a request that awaits (a long poll, a stream) holds nothing, as "
        "with gunicorn's async workers; --request-timeout reports it",
        group="server",
    )
    graceful_timeout: float = setting(
        30.0,
        "--graceful-timeout",
        coerce=c.non_negative_seconds,
        metavar="S",
        help="time to finish in-flight requests on stop",
        doc="how long a stopping worker may finish in-flight requests; also how long a config-file "
        "hook in the monitor runs before it is named and no longer waited for (at least 1 s)",
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
        "(200 once ready, 503 before and while the server drains) without calling the app (`GET`/`HEAD` "
        "without a body, any query; [deploy.md](deploy.md#health-and-readiness---health-path---ready-when)); "
        "not in the access log",
        shown_default="off",
        group="server",
    )
    # Static files (docs/static-files.md)
    static: list[str] = setting(
        [],
        "--static",
        coerce=c.list_of(c.static_mount, split_items=False),
        action="append",
        metavar="PREFIX=DIR",
        help="serve the files under DIR at URL PREFIX before the app (repeatable)",
        doc="`/static=staticfiles`: a `GET`/`HEAD` under PREFIX is answered from DIR (relative to `--chdir`) "
        "by the worker, never the app: MIME type, ETag, Last-Modified, 304, one Range, precompressed "
        "`.br`/`.gz` siblings, sendfile on plain connections; `..`, encoded separators, dotfiles and "
        "symlinks leading out are refused (403), directories are never listed (404); a missing DIR is "
        "exit 2 at start (see docs/static-files.md)",
        shown_default="none",
        group="server",
    )
    static_max_age: int = setting(
        60,
        "--static-max-age",
        coerce=c.integer(0),
        metavar="SECONDS",
        help="Cache-Control max-age of static files whose names carry no content hash",
        doc="`Cache-Control: public, max-age=SECONDS` of a `--static` file whose name carries no content "
        "hash; a content-hashed name (`app.0123456789ab.css`, `index-Dx3k9_aZ.js`) gets "
        "`public, max-age=31536000, immutable`",
        group="server",
    )
    static_follow_symlinks: bool = setting(
        False,
        "--static-follow-symlinks",
        coerce=c.boolean,
        action="boolean_optional",
        help="serve --static files through symlinks that lead out of the mount's directory",
        doc="serve a `--static` file whose real path is outside the mount's directory (a symlink "
        "leading out, as `collectstatic --link` makes); off: such a file is 403, symlinks inside stay served",
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
        "--keep-alive",
        "--keepalive",
        coerce=c.non_negative_seconds,
        metavar="S",
        help="idle keep-alive connection timeout (0: close after each response)",
        doc="idle keep-alive connections are closed after this; 0: each HTTP/1.1 response says "
        "`Connection: close` and its connection closes as soon as it is out, while a new connection "
        "still has `--header-timeout` to send its first request (HTTP/2: a connection closes once "
        "its last stream is done, at the next once-a-second sweep)",
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
        coerce=c.proc_name,
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
        shown_default="`$XDG_RUNTIME_DIR/NAME-BIND.ctl` or `/tmp/refork-UID/NAME-BIND.ctl` (BIND: the "
        "first `--bind`)",
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
        doc="`native` serves with refork._native's engines, in Rust: the whole request path with "
        "`--threads 1`, an I/O thread that needs no GIL feeding the app threads with `--threads N`; "
        "`python` is pure Python; `auto` picks native where the extension is built (docs/native.md)",
        group="server",
    )
