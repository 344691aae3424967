"""The settings table: the Config dataclass, one field per setting, each declared once with setting().

A field's setting() carries its flags, help, --help group, coercer and whether HUP may change it;
argparse, loading and validation from every source, --print-config, RESTART_ONLY and the options
table in docs/configuration.md are all derived from these declarations (see refork.config.load and
refork.config.docs). Modes are Literal types: their allowed values are read from the type. The
fields are declared in three classes, in this order: server_settings (what is served and how),
protocol_settings (WebSockets, TLS, HTTP limits) and Config's own (logging, memory, metrics, hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import refork.config.coercers as c
from refork.config.process_settings import ProcessSettings
from refork.config.protocol_settings import ProtocolSettings, WebSockets
from refork.config.server_settings import Interface, Loop, ReadyWhen, ServerSettings, WsgiLoop
from refork.config.settings import Setting, setting, settings_of
from refork.integrations import NAMES
from refork.log_format import GUNICORN_DEFAULT

LogLevel = Literal["debug", "info", "warning", "error", "critical"]
ForkSafety = Literal["warn", "strict", "off"]
MemoryMetric = Literal["uss", "pss"]
Allocator = Literal["system", "jemalloc"]

REFORKS: list[int] | None = [50, 100, 1000, 0]  # --refork-after 50,100,1000,off: measured on a real app
IDLE_MOLD_SECONDS = 1.0  # --mold-idle-exit auto, with two or more workers: measured on a real app


def idle_mold_linger(setting: float | Literal["auto"] | None, workers: int) -> float | None:
    """Seconds an idle mold lives on (None: it stays). `auto` lets it go only with two or more
    workers: with one, a crash would find no warm worker to promote and start cold."""
    if setting == "auto":
        return IDLE_MOLD_SECONDS if workers >= 2 else None
    return setting

__all__ = [
    "HOOK_NAMES", "IDLE_MOLD_SECONDS", "RESTART_ONLY", "SETTINGS", "Allocator", "Config", "ForkSafety",
    "Interface", "LogLevel", "Loop", "MemoryMetric", "ReadyWhen", "WebSockets", "WsgiLoop",
    "idle_mold_linger", "setting_named",
]


@dataclass
class Config(ProcessSettings, ProtocolSettings, ServerSettings):
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
    access_log_format: str = setting(
        GUNICORN_DEFAULT,
        "--access-logformat",
        "--access-log-format",
        coerce=c.access_log_format,
        metavar="FORMAT",
        help="gunicorn's %(h)s-style atoms, or common, combined, json, uvicorn (default: gunicorn's)",
        doc="a gunicorn format string (atoms `h l u t r m U q H s B b f a T M D L p`, `%({header}i)s`, "
        "`%({header}o)s`, `%({VAR}e)s`), or `common`, `combined`, `json`, `uvicorn` (the default under "
        "`-k` uvicorn workers); see "
        "[configuration.md](configuration.md#access-log-formats)",
        shown_default="gunicorn's, `%(h)s %(l)s %(u)s %(t)s \"%(r)s\" %(s)s %(b)s \"%(f)s\" \"%(a)s\"`",
        group="logging",
    )
    error_logfile: str = setting(
        "-",
        "--log-file",
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
        REFORKS,
        "--refork-after",
        coerce=c.refork_after,
        metavar="N,N,...|off",
        help="requests per generation before promoting a new mold",
        doc="requests per generation before a worker is promoted to be the next mold (the last count "
        "repeats unless the list ends in `off`); `off` never reforks on its own",
        shown_default="50,100,1000,off",
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
    mold_idle_exit: float | Literal["auto"] | None = setting(
        "auto",
        "--mold-idle-exit",
        coerce=c.auto_off_or_seconds,
        metavar="auto|S|off",
        help="stop the mold after S idle seconds to free its memory; a worker is promoted when needed",
        doc="stop the mold after S idle seconds to free the pages only it still holds; a worker is promoted "
        f"to mold when one is needed. `auto`: {IDLE_MOLD_SECONDS:g} s with two or more workers, off with "
        "one (its crash would be a cold start)",
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
    statsd_host: str | None = setting(
        None,
        "--statsd-host",
        coerce=c.statsd_address,
        metavar="HOST:PORT|unix:PATH",
        help="send gunicorn's StatsD metrics here (UDP, or a unix datagram socket), from the monitor",
        doc="send gunicorn's StatsD metrics (`gunicorn.requests`, `gunicorn.request.duration`, ...) and "
        "each worker's memory to this address: `HOST:PORT` (UDP; port 8125 by default) or `unix:PATH` "
        "(a datagram socket); sent by the monitor once a second, never by a request; see "
        "[metrics.md](metrics.md#statsd)",
        shown_default="off",
        group="metrics",
    )
    statsd_prefix: str = setting(
        "",
        "--statsd-prefix",
        coerce=c.string,
        metavar="PREFIX",
        help="prefix of every StatsD metric name (a '.' is added)",
        group="metrics",
    )
    dogstatsd_tags: str = setting(
        "",
        "--dogstatsd-tags",
        coerce=c.statsd_tags,
        metavar="TAG,...",
        help="DogStatsD tags added to every metric, e.g. env:prod,team:web",
        group="metrics",
    )

    # Not settings: what loading found besides values
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)  # config file functions (HOOKS)
    notes: list[tuple[int, str]] = field(default_factory=list, compare=False)  # (level, line) for the start
    sources: dict[str, str] = field(default_factory=dict, compare=False)  # setting -> where it came from

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
"""Every setting, in field order: all Config fields but ``hooks``, ``notes`` and ``sources``."""
NOT_SETTINGS = ("hooks", "notes", "sources")

_BY_NAME: dict[str, Setting[Any]] = {s.name: s for s in SETTINGS}

RESTART_ONLY: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.restart_only)
"""Settings the monitor holds for its whole life (sockets, cwd, title, malloc): HUP keeps them."""

@dataclass(frozen=True)
class Hook:
    """A server hook a config file may define: gunicorn's (same name and arguments) or refork's."""

    name: str
    args: tuple[str, ...]
    runs_in: str  # the process that calls it
    when: str
    gunicorn: bool = True
    arities: tuple[int, ...] = ()  # accepted argument counts, when not just len(args)


HOOKS: tuple[Hook, ...] = (
    Hook("on_starting", ("server",), "monitor", "before the sockets are bound"),
    Hook("on_reload", ("server",), "monitor", "on HUP, once the config was read again"),
    Hook("when_ready", ("server",), "monitor", "once the server is ready (`--ready-when`)"),
    Hook("pre_fork", ("server", "worker"), "mold", "before it forks a worker (gunicorn: the master); "
         "`worker.pid` is `[booting]`"),  # fmt: skip
    Hook("post_fork", ("server", "worker"), "worker", "right after the fork"),
    Hook("post_worker_init", ("worker",), "worker", "when it is about to serve (the app was loaded by the "
         "mold)"),  # fmt: skip
    Hook("worker_int", ("worker",), "worker", "on SIGINT or SIGQUIT, or a fast stop from the monitor"),
    Hook("worker_abort", ("worker",), "worker", "on SIGABRT: the monitor sends it to a worker past "
         "`--timeout`, and SIGKILL a second later"),  # fmt: skip
    Hook("pre_exec", ("server",), "never", "refork never re-executes its monitor (USR2 reforks, HUP "
         "reloads)"),  # fmt: skip
    Hook("pre_request", ("worker", "req"), "worker", "before the app gets a request"),
    Hook("post_request", ("worker", "req", "environ", "resp"), "worker", "after the response was sent",
         arities=(2, 3, 4)),  # fmt: skip
    Hook("child_exit", ("server", "worker"), "monitor", "after a worker (or a mold: `worker.role`) was "
         "reaped"),  # fmt: skip
    Hook("worker_exit", ("server", "worker"), "worker", "before it exits"),
    Hook("nworkers_changed", ("server", "new_value", "old_value"), "monitor", "when the worker count is "
         "set (at start, `old_value` None), by TTIN/TTOU, `refork ttin` or a reload"),  # fmt: skip
    Hook("on_exit", ("server",), "monitor", "before it exits"),
    Hook("ssl_context", ("config", "default_ssl_context_factory"), "monitor", "when the TLS context is "
         "built (start and HUP); returns the `SSLContext`"),  # fmt: skip
    Hook("warmup", ("app",), "mold", "after the app is imported, before the first fork", gunicorn=False),
    Hook("pre_promotion", ("server", "worker"), "worker", "before it forks the next mold (close "
         "connections here)", gunicorn=False),  # fmt: skip
)
HOOK_NAMES = tuple(hook.name for hook in HOOKS)
NO_TIMEOUT = 1e9
"""--timeout 0 (none): the deadline a worker's slot gets, never reached."""


def hard_timeout(config: Config) -> float:
    """The --timeout deadlines are counted with (0 = none)."""
    return config.timeout or NO_TIMEOUT


def setting_named(name: str) -> Setting[Any]:
    """The table row of one setting (its flags, default, env name...), for commands that reuse it."""
    return _BY_NAME[name]
