"""gunicorn's settings, each mapped to what refork does with it: the one table of the migration.

Every setting of gunicorn 27 (its config names, flags and special values, from gunicorn/config.py)
is a row: the same refork setting; a refork setting of another name; nothing, because refork
does not need it (one INFO line at start when it is given); something refork does differently
(one WARNING when it is given a value refork cannot honour); a value refork refuses (one error
line); or a server hook. Loading (refork.config.load) reads gunicorn's names in config files and
gunicorn's flags through this table; docs/from-gunicorn.md is generated from it; hooks read
`server.cfg.<gunicorn name>` through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any, Literal

from refork.errors import ConfigError

How = Literal["same", "renamed", "not needed", "differs", "refused", "hook"]
Action = Literal["store", "store_true", "store_false", "append", "optional"]
Note = tuple[int, str]
Convert = Callable[[Any, str], Any]


@dataclass(frozen=True)
class Row:
    """One gunicorn setting. `refork`: the refork setting it sets (None: none); `note`: what refork
    does, for the docs and the start-up line; `harmless(value)`: True when the value needs no line
    (gunicorn's default, or what refork does anyway); `convert`: gunicorn's value -> refork's."""

    name: str
    flags: tuple[str, ...]
    how: How
    refork: str | None = None
    note: str = ""
    action: Action = "store"
    convert: Convert | None = None
    harmless: Callable[[Any], bool] | None = None
    shows: Any = None  # what server.cfg.<name> reads when refork has no setting for it


def _same(name: str, *flags: str, action: Action = "store", note: str = "", refork: str | None = None,
          convert: Convert | None = None) -> Row:  # fmt: skip
    return Row(name, flags, "same", refork or name, note, action, convert)


def _renamed(name: str, refork: str, *flags: str, note: str = "", action: Action = "store",
             convert: Convert | None = None) -> Row:  # fmt: skip
    return Row(name, flags, "renamed", refork, note, action, convert)


def _unneeded(name: str, *flags: str, note: str, action: Action = "store", default: Any = None,
              shows: Any = None) -> Row:  # fmt: skip
    return Row(name, flags, "not needed", None, note, action, harmless=_is(default), shows=shows)


def _differs(name: str, *flags: str, note: str, action: Action = "store", default: Any = None) -> Row:
    return Row(name, flags, "differs", None, note, action, harmless=_is(default), shows=default)


def _refused(name: str, *flags: str, note: str, action: Action = "store", default: Any = None) -> Row:
    return Row(name, flags, "refused", None, note, action, harmless=_is(default), shows=default)


def _is(*defaults: Any) -> Callable[[Any], bool]:
    def harmless(value: Any) -> bool:
        if isinstance(value, str):
            value = value.strip().lower()
        if value in (False, "false") and True in defaults:  # --no-sendfile: False is what matters
            return False
        return value in defaults or value in (None, False, "", [], {}, "false")

    return harmless


def _hook(name: str, note: str = "") -> Row:
    return Row(name, (), "hook", None, note)


# -- conversions of gunicorn's values ---------------------------------------------------------


def _no_limit_if_zero(value: Any, where: str) -> Any:
    """websocket_max_message_size 0 (gunicorn: no limit): refork's --ws-max-size of 1T."""
    return "1T" if value in (0, "0") else value


def _off_if_true(value: Any, where: str) -> Any:
    """--no-control-socket: control_socket off."""
    return "off" if value in (True, "true", "True", 1) else None


_TLS12 = "refork's TLS is 1.2 or newer; ssl_context(config, factory) customizes the context"

ROWS: tuple[Row, ...] = (
    # Config file
    Row(
        "config",
        ("-c", "--config"),
        "same",
        None,
        "the config file: `PATH`, `file:PATH` or "
        "`python:MODULE`; without `-c`, `./gunicorn.conf.py` is read when it exists",
    ),  # fmt: skip
    _renamed("wsgi_app", "app", note="the APP argument (the command line's APP wins)"),
    # Server socket
    _same(
        "bind",
        "-b",
        "--bind",
        action="append",
        note="gunicorn's default `0.0.0.0:$PORT` when `PORT` "
        "is set, and a host alone is port 8000, as in gunicorn; `[::]:PORT` is dual-stack (it serves IPv4 "
        "clients too), and `unix://tmp/a.sock` is the relative `tmp/a.sock` (under `--chdir`), "
        "as in gunicorn",
    ),  # fmt: skip
    _same("backlog", "--backlog"),
    # Worker processes
    _same("workers", "-w", "--workers", note="`WEB_CONCURRENCY` is its default, as in gunicorn"),
    _same(
        "worker_class",
        "-k",
        "--worker-class",
        note="`sync`, `gthread`: WSGI on `--threads`; "
        "uvicorn's workers and `asgi`: ASGI (uvicorn's: uvicorn's access line); `gevent`, `eventlet`, "
        "`tornado`: threads, no monkey-patching (one WARNING); another class: one error line",
    ),  # fmt: skip
    _same("threads", "--threads"),
    _same(
        "worker_connections",
        "--worker-connections",
        note="the `--threads` of a gevent, eventlet or "
        "tornado worker (at most 64); refork does not cap connections",
    ),  # fmt: skip
    _same("max_requests", "--max-requests"),
    _same("max_requests_jitter", "--max-requests-jitter"),
    _same(
        "timeout",
        "-t",
        "--timeout",
        note="0: no timeout; counts time in the app only (see `--request-timeout` for a soft one)",
    ),  # fmt: skip
    _same("graceful_timeout", "--graceful-timeout"),
    _same("keepalive", "--keep-alive", note="gunicorn's default is 2 s, refork's 5 s"),
    # Security
    _same("limit_request_line", "--limit-request-line", note="0: 1M, gunicorn's no-limit"),
    _same("limit_request_fields", "--limit-request-fields", note="0 or above 32768: 32768"),
    _same("limit_request_field_size", "--limit-request-field_size", note="0: 1M"),
    # Debugging
    _same(
        "reload",
        "--reload",
        action="store_true",
        note="reloads by HUP (a new mold), not by restarting workers",
    ),  # fmt: skip
    _unneeded(
        "reload_engine",
        "--reload-engine",
        default="auto",
        note="refork polls file times once a second; there is no engine to choose",
    ),  # fmt: skip
    _same("reload_extra_files", "--reload-extra-file", action="append"),
    _refused(
        "spew",
        "--spew",
        action="store_true",
        note="refork has no --spew: trace a process with "
        "`python -X importtime`, py-spy or `sys.settrace` in a `post_fork` hook",
    ),  # fmt: skip
    _same(
        "check_config",
        "--check-config",
        action="store_true",
        note="also imports and warms the app, and checks fork safety",
    ),  # fmt: skip
    _same(
        "print_config", "--print-config", action="store_true", note="each value with where it came from"
    ),  # fmt: skip
    # Server mechanics
    _unneeded(
        "preload_app",
        "--preload",
        action="store_true",
        shows=True,
        note="refork always "
        "preloads: a mold imports the app once and forks the workers from it (`warmup` and "
        "`pre_fork` run there)",
    ),  # fmt: skip
    _unneeded(
        "sendfile",
        "--no-sendfile",
        action="store_false",
        default=True,
        note="refork uses sendfile() for file responses where the socket allows it (not with TLS)",
    ),  # fmt: skip
    _same("reuse_port", "--reuse-port", action="store_true"),
    _same("chdir", "--chdir"),
    _same("daemon", "-D", "--daemon", action="store_true"),
    _same("raw_env", "-e", "--env", action="append"),
    _same("pidfile", "-p", "--pid"),
    _unneeded(
        "worker_tmp_dir",
        "--worker-tmp-dir",
        note="refork's workers report liveness through a shared memory page, not a heartbeat file",
    ),  # fmt: skip
    _same("user", "-u", "--user", note="switched to after binding; the mold and workers run as it"),
    _same("group", "-g", "--group"),
    _same("umask", "-m", "--umask"),
    _same("initgroups", "--initgroups", action="store_true"),
    _renamed(
        "tmp_upload_dir", "spool_dir", note="where request bodies over `--body-spool-threshold` are spooled"
    ),  # fmt: skip
    _same("secure_scheme_headers", note="also `--secure-scheme-header NAME=VALUE`"),
    _same(
        "forwarded_allow_ips",
        "--forwarded-allow-ips",
        note="`FORWARDED_ALLOW_IPS` is its default, as in gunicorn; given, a trusted proxy sets the "
        "scheme only, as in gunicorn (with a uvicorn worker, the client too, as uvicorn): "
        "`--forwarded-client on` takes the client from `X-Forwarded-For`; unix-socket peers are trusted "
        "by default too (`unix:`)",
    ),  # fmt: skip
    # Logging
    _renamed("accesslog", "access_logfile", "--access-logfile"),
    _same("disable_redirect_access_to_syslog", "--disable-redirect-access-to-syslog", action="store_true"),
    _same(
        "access_log_format",
        "--access-logformat",
        note="gunicorn's atoms, or refork's `common`, `combined`, `json`",
    ),  # fmt: skip
    _renamed("errorlog", "error_logfile", "--error-logfile", "--log-file"),
    _renamed("loglevel", "log_level", "--log-level"),
    _same("capture_output", "--capture-output", action="store_true"),
    Row(
        "logger_class",
        ("--logger-class",),
        "differs",
        None,
        "refork logs to the `refork` logger and its "
        "access log, not through gunicorn's Logger class: format and route them with `logconfig_dict`",
        harmless=_is("gunicorn.glogging.logger", "simple"),
        shows="gunicorn.glogging.Logger",
    ),  # fmt: skip
    _same("logconfig", "--log-config"),
    _same("logconfig_dict"),
    _same("logconfig_json", "--log-config-json"),
    _same("syslog_addr", "--log-syslog-to"),
    _same("syslog", "--log-syslog", action="store_true"),
    _same("syslog_prefix", "--log-syslog-prefix"),
    _same("syslog_facility", "--log-syslog-facility"),
    _same("enable_stdio_inheritance", "-R", "--enable-stdio-inheritance", action="store_true"),
    _same("statsd_host", "--statsd-host", note="gunicorn's metric names, sent from the monitor"),
    _same("dogstatsd_tags", "--dogstatsd-tags"),
    _same("statsd_prefix", "--statsd-prefix"),
    _unneeded(
        "enable_backlog_metric",
        "--enable-backlog-metric",
        action="store_true",
        note="refork's Prometheus `/metrics` (`--metrics-bind`) report each listener's queue",
    ),  # fmt: skip
    # Process naming
    _same("proc_name", "-n", "--name", note="None: refork's default (`refork`)"),
    _unneeded(
        "default_proc_name", note="gunicorn's internal default; refork's is `refork`", shows="refork"
    ),  # fmt: skip
    # Server mechanics (continued)
    _same("pythonpath", "--pythonpath"),
    _refused(
        "paste",
        "--paste",
        "--paster",
        note="refork does not read PasteDeploy .ini files: point APP "
        "at a module that calls paste.deploy.loadapp(...)",
    ),  # fmt: skip
    # Server hooks
    _hook("on_starting"),
    _hook("on_reload"),
    _hook("when_ready"),
    _hook("pre_fork", "runs in the mold, not the master"),
    _hook("post_fork"),
    _hook("post_worker_init"),
    _hook("worker_int"),
    _hook("worker_abort"),
    _hook("pre_exec", "never called: refork never re-executes its monitor (one INFO line)"),
    _hook("pre_request"),
    _hook("post_request"),
    _hook("child_exit", "also for a mold (`worker.role`)"),
    _hook("worker_exit"),
    _hook("nworkers_changed"),
    _hook("on_exit"),
    _hook("ssl_context"),
    # PROXY protocol and other front-end protocols
    _same("proxy_protocol", "--proxy-protocol", action="optional", note="v1, v2 or auto"),
    _same("proxy_allow_ips", "--proxy-allow-from"),
    _refused(
        "protocol",
        "--protocol",
        default="http",
        note="refork speaks HTTP only, not the uWSGI protocol: use nginx's proxy_pass instead of uwsgi_pass",
    ),  # fmt: skip
    _unneeded(
        "uwsgi_allow_ips",
        "--uwsgi-allow-from",
        default="127.0.0.1,::1",
        note="refork does not speak the uWSGI protocol",
    ),  # fmt: skip
    # SSL
    _same("keyfile", "--keyfile"),
    _same("certfile", "--certfile"),
    _unneeded("ssl_version", "--ssl-version", default=2, note="gunicorn ignores it too; " + _TLS12),
    _same("cert_reqs", "--cert-reqs"),
    _same("ca_certs", "--ca-certs"),
    _unneeded(
        "suppress_ragged_eofs",
        "--suppress-ragged-eofs",
        action="store_true",
        default=True,
        note="refork treats a TLS peer's missing close_notify as the end of the connection",
    ),  # fmt: skip
    _unneeded(
        "do_handshake_on_connect",
        "--do-handshake-on-connect",
        action="store_true",
        note="refork's loops run the handshake without blocking, with `--ssl-handshake-timeout`",
    ),  # fmt: skip
    _same("ciphers", "--ciphers"),
    # HTTP/2
    _same("http_protocols", "--http-protocols", note="refork also takes `h2c` (cleartext, prior knowledge)"),
    _differs(
        "http2_cleartext",
        "--http2-cleartext",
        default="off",
        note="add `h2c` to `--http-protocols`: a cleartext connection that opens with the HTTP/2 preface "
        "is served HTTP/2; `Upgrade: h2c` is answered as HTTP/1.1",
    ),  # fmt: skip
    _same("http2_max_concurrent_streams", "--http2-max-concurrent-streams"),
    _same("http2_initial_window_size", "--http2-initial-window-size"),
    _same("http2_max_frame_size", "--http2-max-frame-size"),
    _same("http2_max_header_list_size", "--http2-max-header-list-size"),
    _unneeded(
        "raw_paste_global_conf",
        "--paste-global",
        action="append",
        note="refork does not read PasteDeploy files",
    ),  # fmt: skip
    # HTTP parsing leniency: refork's parsers stay strict
    _differs(
        "permit_obsolete_folding",
        "--permit-obsolete-folding",
        action="store_true",
        note="refork refuses obsolete line folding (400), as RFC 9112 asks",
    ),  # fmt: skip
    _differs(
        "strip_header_spaces",
        "--strip-header-spaces",
        action="store_true",
        note="refork refuses a space before a header's colon (400): it is how requests are smuggled",
    ),  # fmt: skip
    _differs(
        "permit_unconventional_http_method",
        "--permit-unconventional-http-method",
        action="store_true",
        note="refork takes any RFC 9110 token as a method",
    ),  # fmt: skip
    _differs(
        "permit_unconventional_http_version",
        "--permit-unconventional-http-version",
        action="store_true",
        note="refork serves HTTP/1.0 and 1.1 and answers others 505",
    ),  # fmt: skip
    _differs(
        "casefold_http_method",
        "--casefold-http-method",
        action="store_true",
        note="refork passes the method as sent",
    ),  # fmt: skip
    _differs(
        "forwarder_headers",
        "--forwarder-headers",
        default="script_name,path_info",
        note="refork takes no WSGI variables from headers: set the mount point with `--root-path`",
    ),  # fmt: skip
    Row(
        "header_map",
        ("--header-map",),
        "differs",
        None,
        "refork drops headers with `_` in their name "
        "(gunicorn's `drop`); `refuse` and `dangerous` are not offered",
        harmless=_is("drop"),
        shows="drop",
    ),  # fmt: skip
    # ASGI (gunicorn's asgi worker)
    _renamed("asgi_loop", "loop", "--asgi-loop"),
    _unneeded(
        "asgi_lifespan",
        "--asgi-lifespan",
        default="auto",
        note="refork runs the lifespan protocol when the app supports it (gunicorn's `auto`)",
    ),  # fmt: skip
    _unneeded(
        "asgi_disconnect_grace_period",
        "--asgi-disconnect-grace-period",
        default=3,
        note="refork sends http.disconnect and lets the app finish",
    ),  # fmt: skip
    _renamed(
        "websocket_max_message_size",
        "ws_max_size",
        "--websocket-max-message-size",
        convert=_no_limit_if_zero,
        note="0: no limit (1T)",
    ),
    _unneeded(
        "http_parser",
        "--http-parser",
        default="auto",
        note="refork picks its parser (httptools or the Rust engine)",
    ),  # fmt: skip
    _same("root_path", "--root-path"),
    # Dirty arbiters
    _refused(
        "dirty_apps",
        "--dirty-app",
        action="append",
        note="refork has no dirty arbiter: run such work in a task queue, or as its own refork service",
    ),  # fmt: skip
    _refused("dirty_workers", "--dirty-workers", default=0, note="refork has no dirty arbiter"),
    _unneeded("dirty_timeout", "--dirty-timeout", default=300, note="refork has no dirty arbiter"),
    _unneeded("dirty_threads", "--dirty-threads", default=1, note="refork has no dirty arbiter"),
    _unneeded(
        "dirty_graceful_timeout", "--dirty-graceful-timeout", default=30, note="refork has no dirty arbiter"
    ),  # fmt: skip
    _hook("on_dirty_starting", "never called: refork has no dirty arbiter"),
    _hook("dirty_post_fork", "never called: refork has no dirty arbiter"),
    _hook("dirty_worker_init", "never called: refork has no dirty arbiter"),
    _hook("dirty_worker_exit", "never called: refork has no dirty arbiter"),
    # Control socket
    _same("control_socket", "--control-socket", note="talked to by `refork status`, not gunicornc"),
    _unneeded(
        "control_socket_mode",
        "--control-socket-mode",
        default=0o600,
        note="refork's control socket is its owner's only (0600, in a private directory)",
    ),  # fmt: skip
    _renamed(
        "control_socket_disable",
        "control_socket",
        "--no-control-socket",
        action="store_true",
        convert=_off_if_true,
        note="`--control-socket off`",
    ),  # fmt: skip
)

BY_NAME: dict[str, Row] = {row.name: row for row in ROWS}


def translate(
    name: str, value: Any, where: str, known: Callable[[str], bool]
) -> tuple[list[tuple[str, Any]], list[Note]]:
    """A gunicorn setting's value -> [(refork setting, raw value)] and the lines to log at start.

    `known(name)` says whether refork has a setting of that name (statsd_host and the PROXY
    protocol's settings arrive with their own module). ConfigError for a refused value.
    """
    row = BY_NAME[name]
    harmless = row.harmless(value) if row.harmless else False
    if row.how == "refused":
        if harmless:
            return [], []
        raise ConfigError(f"{where}: {row.note}")
    if row.how in ("not needed", "differs"):
        if harmless:
            return [], []
        level = INFO if row.how == "not needed" else WARNING
        return [], [(level, f"{where}: {row.note}".replace("`", ""))]
    if row.refork is None:
        return [], []
    if not known(row.refork):
        return [], [(WARNING, f"{where}: this refork has no {row.refork} setting; ignored")]
    converted = row.convert(value, where) if row.convert else value
    if converted is None and row.convert is not None:
        return [], []
    return [(row.refork, converted)], []


def gunicorn_value(config: Any, name: str) -> tuple[bool, Any]:
    """What gunicorn's `cfg.<name>` reads in refork: (found, value); hooks read server.cfg too."""
    row = BY_NAME.get(name)
    if row is None:
        return False, None
    if row.how == "hook":
        hook = config.hooks.get(name)
        return True, hook if hook is not None else (lambda *args: None)
    if row.refork is not None and hasattr(config, row.refork):
        value = getattr(config, row.refork)
        if name == "control_socket_disable":
            return True, value is None
        return True, value
    return True, row.shows
