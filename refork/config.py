"""One configuration object, built from defaults, pyproject.toml, a config file, REFORK_* env and the CLI.

Precedence, lowest first: defaults, WEB_CONCURRENCY (workers only), ``[tool.refork]`` in
./pyproject.toml, the ``-c`` Python config file, ``REFORK_*`` environment variables, CLI flags.
"""

from __future__ import annotations

import ast
import math
import os
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from dataclasses import fields as _dc_fields
from typing import Any


class ConfigError(Exception):
    """A user mistake in configuration: printed as one line, exit status 2, no traceback."""


@dataclass
class Config:
    # What to serve
    app: str = ""
    interface: str = "auto"  # auto | wsgi | asgi
    chdir: str | None = None
    pythonpath: list[str] = field(default_factory=list)
    root_path: str = ""  # SCRIPT_NAME / ASGI root_path

    # Sockets
    bind: list[str] = field(default_factory=lambda: ["127.0.0.1:8000"])
    backlog: int = 2048
    forwarded_allow_ips: list[str] = field(default_factory=lambda: ["127.0.0.1", "::1"])

    # Processes
    workers: int = 1
    threads: int = 1
    timeout: float = 30.0  # a worker busy on one request longer than this is killed
    graceful_timeout: float = 30.0
    keepalive: float = 5.0  # idle keep-alive connection timeout
    header_timeout: float = 10.0  # time allowed to receive a complete request head
    spawn_timeout: float = 10.0  # a worker or promoted mold must report in within this
    max_requests: int = 0
    max_requests_jitter: int = 0
    proc_name: str = "refork"
    control_socket: str | None = None  # default: see refork.process.control.default_path
    pidfile: str | None = None  # the monitor's pid is written here (absolute: relative to the cwd)
    loop: str = "auto"  # auto | asyncio | uvloop (ASGI)

    # HTTP limits
    limit_request_line: int = 8190
    limit_request_fields: int = 100
    limit_request_field_size: int = 8190
    limit_request_body: int = 1 << 30  # 0 = unlimited
    body_spool_threshold: int = 1 << 20  # larger request bodies go to a temp file

    # Logging
    access_logfile: str | None = None  # None = off, "-" = stdout
    access_log_format: str = "common"  # common | combined | json
    error_logfile: str = "-"  # "-" = stderr
    log_level: str = "info"

    # Memory (issue 3)
    immortalize: bool = True
    warmup: list[str] = field(default_factory=list)  # request paths sent through the app in the mold
    refork_after: list[int] | None = None  # None = off
    refork_max_unavailable: int | None = None  # None = ceil(10% of workers)
    mold_idle_exit: float | None = None  # seconds an idle mold lingers; None = it stays
    fork_safety: str = "warn"  # warn | strict | off: connections and threads a fork would inherit
    max_worker_memory: int = 0  # bytes, 0 = off
    memory_metric: str = "uss"  # uss | pss
    memory_interval: float = 10.0  # seconds between smaps_rollup samples per process
    allocator: str = "system"  # system | jemalloc
    malloc_trim: bool = False
    memray: str | None = None  # directory for one memray capture per worker

    # Hooks (from the config file only): callables named like gunicorn's
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)

    # Modes
    check_config: bool = False
    print_config: bool = False
    reload: bool = False  # development: reload (as on HUP) when a watched *.py file changes
    reload_dirs: list[str] = field(default_factory=list)  # default: the working directory and pythonpath


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


# --------------------------------------------------------------------------------------------
# Loading: every source yields raw values; one coercer per field validates and converts them.
# --------------------------------------------------------------------------------------------

Coercer = Callable[[Any, str], Any]  # (raw value, where it came from) -> validated value

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def _got(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _int(minimum: int, what: str | None = None) -> Coercer:
    what = what or ("a positive integer" if minimum == 1 else f"an integer >= {minimum}")

    def coerce(value: Any, where: str) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{where} must be {what}, got {_got(value)}")
        return value

    return coerce


def _seconds(value: Any) -> float | None:
    """A finite number of seconds from a number or a numeric string; None if it is not one."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isinf(value) or value != value:
        return None
    return float(value)


def _positive_float(value: Any, where: str) -> float:
    """Timeouts and intervals: seconds, strictly positive."""
    seconds = _seconds(value)
    if seconds is None or not seconds > 0:
        raise ConfigError(f"{where} must be a number of seconds > 0, got {_got(value)}")
    return seconds


def _off_or_seconds(value: Any, where: str) -> float | None:
    """A delay that can be switched off: "off" (or None) -> None, else seconds >= 0."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "")):
        return None
    seconds = _seconds(value)
    if seconds is None or seconds < 0:
        raise ConfigError(f'{where} must be a number of seconds >= 0 or "off", got {_got(value)}')
    return seconds


def _choice(*options: str) -> Coercer:
    def coerce(value: Any, where: str) -> str:
        if isinstance(value, str) and value.strip().lower() in options:
            return value.strip().lower()
        raise ConfigError(f"{where} must be one of {'|'.join(options)}, got {_got(value)}")

    return coerce


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {_got(value)}")
    return value


def _nonempty_str(value: Any, where: str) -> str:
    if not _str(value, where).strip():
        raise ConfigError(f"{where} must not be empty")
    return value.strip()


def _opt_str(value: Any, where: str) -> str | None:
    """Optional paths: None or an empty string mean "not set"."""
    if value is None or value == "":
        return None
    return _str(value, where)


def _bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"{where} must be true or false (1/0, yes/no, on/off), got {_got(value)}")


def _list(item: Coercer, split_items: bool = True) -> Coercer:
    """A list from a list/tuple or from a comma-separated string (env vars, some flags)."""

    def coerce(value: Any, where: str) -> list[Any]:
        if isinstance(value, str):
            parts = value.split(",")
        elif isinstance(value, (list, tuple)):
            parts = []
            for v in value:
                parts.extend(v.split(",") if split_items and isinstance(v, str) else [v])
        else:
            raise ConfigError(f"{where} must be a list or a comma-separated string, got {_got(value)}")
        return [item(p.strip() if isinstance(p, str) else p, where) for p in parts if p != ""]

    return coerce


def parse_size(text: str) -> int:
    """'512M' -> 536870912, '1.5G' -> 1610612736: K/M/G/T are powers of 1024 ("B"/"iB" tolerated)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(
            f"invalid size {text!r}: expected a number of bytes with an optional unit "
            "K, M, G or T (powers of 1024), e.g. 512M or 1G"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def _size(value: Any, where: str) -> int:
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"{where} must be a size in bytes like 1048576, 512K, 512M or 2G, got {_got(value)}")


def cpu_quota(root: str = "/sys/fs/cgroup") -> int:
    """CPUs this process may use: the cgroup v2/v1 CPU quota if set, else the CPU count (>= 1)."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quota = period = 0
    try:
        with open(os.path.join(root, "cpu.max")) as f:
            q, _, p = f.read().strip().partition(" ")
        if q != "max":
            quota, period = int(q), int(p or 100000)
    except (OSError, ValueError):
        for sub in ("cpu", "cpu,cpuacct"):
            try:
                with open(os.path.join(root, sub, "cpu.cfs_quota_us")) as f:
                    quota = int(f.read())
                with open(os.path.join(root, sub, "cpu.cfs_period_us")) as f:
                    period = int(f.read())
                break
            except (OSError, ValueError):
                quota = period = 0
    if quota > 0 and period > 0:
        count = min(count, math.ceil(quota / period))
    return max(1, count)


def _workers(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return cpu_quota()
    return _int(1, 'a positive integer or "auto"')(value, where)


_BIND_HOST_RE = re.compile(r"^(\[[0-9A-Fa-f:.%\w]+\]|[\w.\-]*):(\d{1,5})$")


def _bind(value: Any, where: str) -> str:
    """HOST:PORT, [V6]:PORT, :PORT, unix:PATH or fd://N (syntax only; binding happens later)."""
    value = _str(value, where).strip()
    if value.startswith("unix:") and len(value) > 5:
        return value
    if value.startswith("fd://") and value[5:].isdigit():
        return value
    m = _BIND_HOST_RE.match(value)
    if m and int(m.group(2)) <= 65535:
        return value
    raise ConfigError(
        f"{where}: {_got(value)} is not a valid address; use HOST:PORT, [V6]:PORT, :PORT, unix:PATH or fd://N"
    )


def _proxy(value: Any, where: str) -> str:
    value = _str(value, where)
    if "/" in value:
        import ipaddress

        try:
            ipaddress.ip_network(value, strict=False)
        except ValueError:
            raise ConfigError(f"{where}: {_got(value)} is not an IP network like 10.0.0.0/8") from None
    return value


def _url_path(value: Any, where: str) -> str:
    value = _str(value, where).strip()
    if value and not value.startswith("/"):
        raise ConfigError(f"{where} must start with '/', got {_got(value)}")
    return value


def _root_path(value: Any, where: str) -> str:
    return _url_path(value, where).rstrip("/")


def _refork_after(value: Any, where: str) -> list[int] | None:
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("off", "")):
        return None
    # A trailing "off" (False in a config file) stops reforking after the last count, as in Pitchfork;
    # it is kept as a final 0.
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    stop = isinstance(items, list | tuple) and len(items) > 1 and (
        items[-1] is False or (isinstance(items[-1], str) and items[-1].lower() == "off")
    )
    if stop:
        items = list(items[:-1])
    try:
        counts = _list(_int(1))(items, where) or None
    except ConfigError:
        raise ConfigError(
            f'{where} must be request counts like 500,1000,2000 (optionally ending in ",off") or "off", '
            f"got {_got(value)}"
        ) from None
    return counts + [0] if counts and stop else counts


def _opt_positive_int(value: Any, where: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    return _int(1, 'a positive integer or "auto"')(value, where)


FIELD_COERCERS: dict[str, Coercer] = {
    "app": _str,
    "interface": _choice("auto", "wsgi", "asgi"),
    "chdir": _opt_str,
    "pythonpath": _list(_str),
    "root_path": _root_path,
    "bind": _list(_bind, split_items=False),
    "backlog": _int(1),
    "forwarded_allow_ips": _list(_proxy),
    "workers": _workers,
    "threads": _int(1),
    "timeout": _positive_float,
    "graceful_timeout": _positive_float,
    "keepalive": _positive_float,
    "header_timeout": _positive_float,
    "spawn_timeout": _positive_float,
    "max_requests": _int(0),
    "max_requests_jitter": _int(0),
    "proc_name": _nonempty_str,
    "control_socket": _opt_str,
    "pidfile": _opt_str,
    "loop": _choice("auto", "asyncio", "uvloop"),
    "limit_request_line": _int(1),
    "limit_request_fields": _int(1),
    "limit_request_field_size": _int(1),
    "limit_request_body": _size,
    "body_spool_threshold": _size,
    "access_logfile": _opt_str,
    "access_log_format": _choice("common", "combined", "json"),
    "error_logfile": _nonempty_str,
    "log_level": _choice("debug", "info", "warning", "error", "critical"),
    "immortalize": _bool,
    "warmup": _list(_url_path, split_items=False),
    "refork_after": _refork_after,
    "refork_max_unavailable": _opt_positive_int,
    "mold_idle_exit": _off_or_seconds,
    "fork_safety": _choice("warn", "strict", "off"),
    "max_worker_memory": _size,
    "memory_metric": _choice("uss", "pss"),
    "memory_interval": _positive_float,
    "allocator": _choice("system", "jemalloc"),
    "malloc_trim": _bool,
    "memray": _opt_str,
    "check_config": _bool,
    "reload": _bool,
    "reload_dirs": _list(_nonempty_str),
    "print_config": _bool,
}
"""Every Config field settable from a source (all but ``hooks``)."""


def _did_you_mean(name: str, candidates: list[str], cutoff: float = 0.7, shown: str = "{}") -> str:
    """' (did you mean 'x'?)' for a close candidate, else ''; shown formats the suggestion."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=cutoff)
    return f" (did you mean {shown.format(close[0])!r}?)" if close else ""


def _from_pyproject(cwd: str) -> list[tuple[str, Any, str]]:
    """[tool.refork] in ./pyproject.toml; ignored (with a debug note) when no TOML parser exists."""
    path = os.path.join(cwd, "pyproject.toml")
    if not os.path.isfile(path):
        return []
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            import logging

            logging.getLogger("refork").debug("ignoring %s: install tomli to read it on Python 3.10", path)
            return []
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f).get("tool", {}).get("refork", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    out = []
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in FIELD_COERCERS:
            hint = _did_you_mean(name, list(FIELD_COERCERS))
            raise ConfigError(f"unknown setting {key!r} in {path} [tool.refork]{hint}")
        out.append((name, value, f"{key} in {path} [tool.refork]"))
    return out


def _imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
    return names


def _from_config_file(path: str) -> tuple[list[tuple[str, Any, str]], dict[str, Callable[..., Any]]]:
    """Execute a gunicorn.conf.py-style file: settings are module-level names, hooks are functions.

    Names starting with "_", modules and imported names are ignored; anything else must be a
    setting or a hook so that typos do not pass silently.
    """
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror} (check -c/--config)") from None
    try:
        tree = ast.parse(source, path)
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: {e.msg} (in config file)") from None
    namespace: dict[str, Any] = {"__file__": path, "__name__": "__refork_config__"}
    exec(compile(tree, path, "exec"), namespace)  # user code: its own errors keep their traceback
    skip = _imported_names(tree)
    values, hooks = [], {}
    for key, value in namespace.items():
        if key.startswith("_") or key in skip or isinstance(value, types.ModuleType):
            continue
        name = key.replace("-", "_")
        if name in HOOK_NAMES:
            if not callable(value):
                raise ConfigError(f"{key} in {path} is a server hook: make it a function, got {_got(value)}")
            hooks[name] = value
        elif name in FIELD_COERCERS:
            values.append((name, value, f"{key} in {path}"))
        else:
            hint = _did_you_mean(name, list(FIELD_COERCERS) + list(HOOK_NAMES))
            raise ConfigError(
                f"unknown setting {key!r} in {path}{hint}; prefix helper names with '_' to keep them"
            )
    return values, hooks


def _from_env(environ: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    """REFORK_<FIELD>; unknown REFORK_* names are left alone unless they look like a typo."""
    out = []
    for key, value in environ.items():
        if not key.startswith("REFORK_"):
            continue
        name = key[7:].lower()
        if name in FIELD_COERCERS:
            out.append((name, value, key))
        else:
            # strict cutoff: other tools (and refork itself) may use REFORK_* names of their own
            hint = _did_you_mean(key[7:], [n.upper() for n in FIELD_COERCERS], cutoff=0.75, shown="REFORK_{}")
            if hint:
                raise ConfigError(f"unknown environment variable {key}{hint}")
    return out


def load_config(argv: list[str], environ: Mapping[str, str] = os.environ, cwd: str | None = None) -> Config:
    """Build the Config: defaults < WEB_CONCURRENCY < pyproject < -c file < REFORK_* < CLI."""
    from refork.cli import parse_args

    cwd = cwd or os.getcwd()
    cli_values, config_file = parse_args(argv)
    sources: list[tuple[str, Any, str]] = []
    if environ.get("WEB_CONCURRENCY"):
        sources.append(("workers", environ["WEB_CONCURRENCY"], "WEB_CONCURRENCY"))
    sources += _from_pyproject(cwd)
    hooks: dict[str, Callable[..., Any]] = {}
    if config_file:
        file_values, hooks = _from_config_file(os.path.join(cwd, config_file))
        sources += file_values
    sources += _from_env(environ)
    sources += cli_values

    config = Config()
    for name, value, where in sources:
        setattr(config, name, FIELD_COERCERS[name](value, where))
    config.hooks = hooks
    if config.pidfile:  # paths the monitor uses are relative to where it started, not --chdir
        config.pidfile = os.path.join(cwd, config.pidfile)
    config.reload_dirs = [os.path.join(cwd, d) for d in config.reload_dirs]
    if not config.app and not config.print_config:
        raise ConfigError("no APP given: run refork [OPTIONS] module:app (e.g. refork mysite.wsgi:app)")
    if not config.bind:
        raise ConfigError("no address to listen on: give at least one -b/--bind")
    return config


RESTART_ONLY = (
    "bind",
    "backlog",
    "control_socket",
    "pidfile",
    "chdir",
    "proc_name",
    "allocator",
    "reload",
    "reload_dirs",
)
"""Settings the monitor holds for its whole life (sockets, cwd, title, malloc): HUP keeps them."""


def reloaded(current: Config, new: Config) -> tuple[Config, list[str], list[str]]:
    """A re-read config for HUP: (new with RESTART_ONLY kept from current, changed, kept names)."""
    names = [f.name for f in _dc_fields(Config) if f.name not in ("hooks", "check_config", "print_config")]
    changed = [n for n in names if n not in RESTART_ONLY and getattr(new, n) != getattr(current, n)]
    kept = [n for n in RESTART_ONLY if getattr(new, n) != getattr(current, n)]
    return replace(new, **{n: getattr(current, n) for n in RESTART_ONLY}), changed, kept


def describe(config: Config) -> str:
    """`name = value` lines (Python literals, so they can seed a config file); hooks by name."""
    lines = []
    for f in _dc_fields(config):
        value = getattr(config, f.name)
        if f.name == "hooks":
            lines.append(f"hooks = {sorted(value)!r}")
        else:
            lines.append(f"{f.name} = {value!r}")
    return "\n".join(lines)


__all__ = [
    "RESTART_ONLY",
    "Config",
    "ConfigError",
    "HOOK_NAMES",
    "cpu_quota",
    "describe",
    "load_config",
    "parse_size",
    "reloaded",
]
