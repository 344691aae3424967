"""The settings of the process around the server: daemon, user and group, umask, environment,
logging destinations, and the worker class a gunicorn config names.

Part of the one settings table (refork.config.table.Config inherits these fields); see there.
Most came from gunicorn and keep its names, flags and special values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import refork.config.coercers as c
import refork.config.process_coercers as pc
from refork.config.settings import setting

SECURE_SCHEME_HEADERS = {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"}
_NO_DICT: dict[str, Any] = {}


@dataclass
class ProcessSettings:
    # Processes
    worker_class: str = setting(
        "sync",
        "-k",
        "--worker-class",
        coerce=pc.worker_class,
        metavar="CLASS",
        help="gunicorn's worker class: sync, gthread, uvicorn's UvicornWorker, gevent... (see docs)",
        doc="gunicorn's worker class, mapped: `sync` and `gthread` serve WSGI on `--threads`; "
        "`uvicorn.workers.UvicornWorker`, `uvicorn_worker.UvicornWorker` (and their H11 variants) "
        "and gunicorn's `asgi` serve ASGI; `gevent`, `eventlet` and `tornado` run on threads without "
        "monkey-patching (`--threads` from `--worker-connections`, at most 64); see "
        "[from-gunicorn.md](from-gunicorn.md)",
        group="server",
    )
    worker_connections: int | None = setting(
        None,
        "--worker-connections",
        coerce=pc.optional_positive_int,
        metavar="N",
        help="gevent/eventlet workers: sets --threads (at most 64)",
        doc="with a gevent, eventlet or tornado `--worker-class`, the `--threads` each worker runs "
        "(at most 64; 32 when unset); otherwise unused: a worker's connections are not capped",
        shown_default="",
        group="server",
    )
    daemon: bool = setting(
        False,
        "-D",
        "--daemon",
        coerce=c.boolean,
        action="store_true",
        help="detach from the terminal and run in the background",
        doc="detach (double fork, new session, stdio to /dev/null unless "
        "`--enable-stdio-inheritance`) once the config and the app path are checked; use `--pid` to "
        "find it",
        group="process",
        restart_only=True,
    )
    user: str | None = setting(
        None,
        "-u",
        "--user",
        coerce=pc.user,
        metavar="USER",
        help="run the mold and workers as USER (name or uid) once the sockets are bound",
        doc="the user (name or uid) the monitor switches to once the sockets, pid file and control "
        "socket exist: every mold and worker runs as it. Needs root",
        group="process",
        restart_only=True,
    )
    group: str | None = setting(
        None,
        "-g",
        "--group",
        coerce=pc.group,
        metavar="GROUP",
        help="run as GROUP (name or gid); default: USER's primary group",
        doc="the group (name or gid) switched to with `--user`; default: the user's primary group",
        group="process",
        restart_only=True,
    )
    initgroups: bool = setting(
        False,
        "--initgroups",
        coerce=c.boolean,
        action="store_true",
        help="also take USER's supplementary groups",
        doc="with `--user`, also take the user's supplementary groups (initgroups)",
        group="process",
        restart_only=True,
    )
    umask: int | None = setting(
        None,
        "-m",
        "--umask",
        coerce=pc.umask,
        metavar="MASK",
        help="umask of the server's processes, e.g. 0o022 or 022",
        doc="the file mode mask of every refork process (unix sockets included), as `os.umask` takes "
        "it: `18`, `0o022`, `022` (octal, as gunicorn reads a leading 0) or `0x12`; unset keeps the "
        "inherited one",
        group="process",
        restart_only=True,
    )
    raw_env: list[str] = setting(
        [],
        "-e",
        "--env",
        coerce=pc.env_assignments,
        action="append",
        metavar="KEY=VALUE",
        help="set an environment variable before the app is loaded",
        doc="an environment variable set in the monitor before the app is imported (so in every "
        "mold and worker)",
        group="process",
        restart_only=True,
    )
    reuse_port: bool = setting(
        False,
        "--reuse-port",
        coerce=c.boolean,
        action="store_true",
        help="set SO_REUSEPORT on TCP listeners",
        doc="set `SO_REUSEPORT` on the TCP listeners refork binds (another server may bind the same port)",
        group="process",
        restart_only=True,
    )
    secure_scheme_headers: dict[str, str] = setting(
        dict(SECURE_SCHEME_HEADERS),
        "--secure-scheme-header",
        coerce=pc.secure_scheme_headers,
        metavar="NAME=VALUE",
        action="append",
        help="a header and value a trusted proxy sends for https (gunicorn's dict)",
        doc="headers and values a proxy in `--forwarded-allow-ips` sends for an https request "
        "(names case-insensitive, values exact); a config file gives a dict as gunicorn does",
        shown_default="`X-FORWARDED-PROTOCOL=ssl`, `X-FORWARDED-PROTO=https`, `X-FORWARDED-SSL=on`",
        group="process",
    )
    reload_extra_files: list[str] = setting(
        [],
        "--reload-extra-file",
        coerce=c.list_of(c.nonempty_string, split_items=False),
        action="append",
        metavar="FILE",
        help="with --reload, also watch FILE (a glob pattern too)",
        doc="with `--reload`, a file (or glob pattern, `**` recursive) whose change reloads too, "
        "relative to where refork started",
        restart_only=True,
    )

    # Logging destinations
    capture_output: bool = setting(
        False,
        "--capture-output",
        coerce=c.boolean,
        action="store_true",
        help="send the app's stdout/stderr to the error log file",
        doc="redirect stdout and stderr of every process to `--error-logfile` (when it is a file)",
        group="logging",
    )
    enable_stdio_inheritance: bool = setting(
        False,
        "-R",
        "--enable-stdio-inheritance",
        coerce=c.boolean,
        action="store_true",
        help="keep stdout/stderr with --daemon",
        doc="with `--daemon`, keep the terminal's stdout and stderr instead of /dev/null",
        group="logging",
    )
    logconfig: str | None = setting(
        None,
        "--log-config",
        coerce=c.optional_string,
        metavar="FILE",
        help="logging.config.fileConfig file",
        doc="a `logging.config.fileConfig` file applied after refork's own logging set-up (its "
        "`refork` logger is the error log)",
        group="logging",
    )
    logconfig_dict: dict[str, Any] = setting(
        _NO_DICT,
        "--log-config-dict",
        coerce=pc.log_dict,
        metavar="JSON",
        help="logging.config.dictConfig dict (a config file's dict, or JSON)",
        doc="a `logging.config.dictConfig` dict (JSON on the command line), applied after refork's "
        "own set-up; wins over `--log-config` and `--log-config-json`. Loggers `refork` (the error "
        "log) and `gunicorn.error` are the same; `gunicorn.access` and `refork.access` are not used",
        shown_default="",
        group="logging",
    )
    logconfig_json: str | None = setting(
        None,
        "--log-config-json",
        coerce=c.optional_string,
        metavar="FILE",
        help="logging.config.dictConfig JSON file",
        group="logging",
    )
    syslog: bool = setting(
        False,
        "--log-syslog",
        coerce=c.boolean,
        action="store_true",
        help="also send the error log to syslog",
        doc="also send the error log to syslog (the access log stays in `--access-logfile`)",
        group="logging",
    )
    syslog_addr: str = setting(
        "udp://localhost:514",
        "--log-syslog-to",
        coerce=pc.syslog_address,
        metavar="ADDR",
        help="syslog address: unix://PATH[#dgram|#stream], udp://HOST:PORT, tcp://HOST:PORT",
        group="logging",
    )
    syslog_prefix: str | None = setting(
        None,
        "--log-syslog-prefix",
        coerce=c.optional_string,
        metavar="PREFIX",
        help="syslog program name: refork.PREFIX",
        doc="the syslog program name becomes `refork.PREFIX` (default: the process title's name)",
        group="logging",
    )
    syslog_facility: str = setting(
        "user",
        "--log-syslog-facility",
        coerce=pc.syslog_facility,
        metavar="FACILITY",
        help="syslog facility name",
        group="logging",
    )
    disable_redirect_access_to_syslog: bool = setting(
        False,
        "--disable-redirect-access-to-syslog",
        coerce=c.boolean,
        action="store_true",
        help="gunicorn's: keep the access log out of syslog (refork never sends it there)",
        group="logging",
    )
