"""Loading: every source yields raw values, one coercer per setting checks them, into one Config.

Precedence, lowest first: defaults; the environment's defaults as gunicorn reads them
(WEB_CONCURRENCY for workers, PORT for bind, FORWARDED_ALLOW_IPS); ``[tool.refork]`` in
./pyproject.toml; the config file (``-c PATH``, ``-c python:MODULE``, else ./gunicorn.conf.py);
GUNICORN_CMD_ARGS; ``REFORK_*`` environment variables; the command line. gunicorn's names and
flags are read through refork.config.gunicorn's table; where each value came from is kept for
--print-config.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import os
import shlex
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from logging import INFO, WARNING
from typing import Any, NoReturn

import refork.config.coercers as c
import refork.config.gunicorn as gunicorn
import refork.config.process_coercers as pc
from refork import __version__
from refork.config.settings import add_arguments, given
from refork.config.table import HOOKS, NOT_SETTINGS, RESTART_ONLY, SETTINGS, Config, setting_named
from refork.errors import ConfigError

Source = list[tuple[str, Any, str]]
"""(setting name, raw value, where it came from); a gunicorn-only name is "gunicorn:<name>"."""

_NAMES = {s.name for s in SETTINGS}
_HOOKS = {hook.name: hook for hook in HOOKS}
_GUNICORN = "gunicorn:"
DEFAULT_CONFIG_FILE = "gunicorn.conf.py"
_FILE_CHECKS: dict[str, Callable[[Any, str], Any]] = {"umask": pc.file_umask}
"""A config file's values that gunicorn reads more strictly than its flags (its validator, not auto_int)."""
GREEN_THREADS, MOST_GREEN_THREADS = 32, 64
SCHEME_ONLY = (
    "as in gunicorn, a trusted proxy's X-Forwarded-Proto sets the scheme and REMOTE_ADDR stays the "
    "proxy's address (--forwarded-client on takes the client from X-Forwarded-For)"
)
UVICORN_ACCESS = (
    "the access log is uvicorn's line (ADDRESS - \"GET / HTTP/1.1\" 200), without the client's port; "
    "--access-logformat chooses another"
)
ANY_CLIENT = (
    "every address is a trusted proxy, every X-Forwarded-For hop too, so a client chooses its own "
    "REMOTE_ADDR (the left-most entry): name the proxies, or set --forwarded-client off"
)


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            words = message.split(": ", 1)[1].split()
            unknown = next((w for w in words if w.startswith("-")), None)
            if unknown is not None:
                flags = [o for action in self._actions for o in action.option_strings if o.startswith("--")]
                hint = _did_you_mean(unknown.split("=")[0], flags, cutoff=0.75)
                message = f"unknown option {unknown.split('=')[0]}{hint}"
        raise ConfigError(f"{message} (see refork --help)")


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, sized as shutil would size it but without importing shutil (and its
    zlib, bz2 and lzma): argparse makes one for every flag it adds, in the monitor too."""

    def __init__(self, prog: str, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("width", _terminal_columns() - 2)
        super().__init__(prog, *args, **kwargs)


def _terminal_columns() -> int:
    """shutil.get_terminal_size().columns: $COLUMNS, else the terminal on stdout, else 80."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def _gunicorn_flags(parser: argparse.ArgumentParser) -> None:
    """gunicorn's flags that no refork setting has: read through the table, not shown in --help."""
    taken = set(parser._option_string_actions)
    for row in gunicorn.ROWS:
        flags = [f for f in row.flags if f not in taken]
        if not flags or row.how == "hook" or row.name == "config":
            continue
        dest = _GUNICORN + row.name
        if row.action == "store_true":
            parser.add_argument(*flags, dest=dest, action="store_const", const=True, help=argparse.SUPPRESS)
        elif row.action == "store_false":
            parser.add_argument(*flags, dest=dest, action="store_const", const=False, help=argparse.SUPPRESS)
        elif row.action == "optional":
            parser.add_argument(*flags, dest=dest, nargs="?", const="auto", help=argparse.SUPPRESS)
        else:
            parser.add_argument(*flags, dest=dest, action=row.action, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """The `refork` command line: one argument per setting, defaults suppressed (absent = not given)."""
    parser = _Parser(
        prog="refork",
        usage="refork [OPTIONS] APP\n       refork status|refork|reload|ttin|ttou [...]",
        description="A pre-fork HTTP server for Python WSGI/ASGI apps, with reforking. gunicorn's "
        "flags and config files work as they are (docs/from-gunicorn.md).",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
        formatter_class=_Formatter,
    )
    parser.add_argument("-v", "--version", action="version", version=f"refork {__version__}")
    parser.add_argument(
        "-c", "--config", dest="config_file", metavar="FILE",
        help="Python config file, as gunicorn's: PATH or python:MODULE (default: ./gunicorn.conf.py if "
        "it exists)",
    )  # fmt: skip
    add_arguments(parser, SETTINGS)
    _gunicorn_flags(parser)
    return parser


def parse_args(argv: list[str], label: str = "") -> tuple[Source, str | None]:
    """Flags given -> [(setting, raw value, flag name)], plus the -c config file path if any.

    `label` prefixes where each value came from (GUNICORN_CMD_ARGS)."""
    namespace = build_parser().parse_args(argv)
    values = given(namespace, SETTINGS)
    for dest, value in vars(namespace).items():
        if dest.startswith(_GUNICORN):
            values.append((dest, value, gunicorn.BY_NAME[dest[len(_GUNICORN) :]].flags[-1]))
    if label:
        values = [(name, value, f"{label} {where}") for name, value, where in values]
    return values, getattr(namespace, "config_file", None)


def _did_you_mean(name: str, candidates: list[str], cutoff: float = 0.7, shown: str = "{}") -> str:
    """' (did you mean 'x'?)' for a close candidate, else ''; shown formats the suggestion."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=cutoff)
    return f" (did you mean {shown.format(close[0])!r}?)" if close else ""


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def _from_pyproject(cwd: str) -> Source:
    """[tool.refork] in ./pyproject.toml; ignored (with a debug note) when no TOML parser exists."""
    path = os.path.join(cwd, "pyproject.toml")
    if not os.path.isfile(path):
        return []
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10
        try:
            import tomli as tomllib
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
        if name not in _NAMES and name not in gunicorn.BY_NAME:
            hint = _did_you_mean(name, sorted(_NAMES))
            raise ConfigError(f"unknown setting {key!r} in {path} [tool.refork]{hint}")
        name = name if name in _NAMES else _GUNICORN + name
        out.append((name, value, f"{key} in {path} [tool.refork]"))
    return out


def _imported_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names.add(alias.asname or alias.name.split(".")[0])
    return names


def _read_config_file(location: str, cwd: str) -> tuple[dict[str, Any], set[str], str]:
    """gunicorn's forms: PATH, file:PATH or python:MODULE -> (its names, imported names, its label)."""
    if location.startswith("python:"):
        module = location[len("python:") :]
        sys.path.insert(0, cwd)
        try:
            loaded = sys.modules.get(module)  # HUP reads it again, edits included
            found = importlib.reload(loaded) if loaded is not None else importlib.import_module(module)
            return dict(vars(found)), set(), location
        except ImportError as e:
            raise ConfigError(f"cannot import config module {module!r} (-c {location}): {e}") from None
        finally:
            sys.path.remove(cwd)
    path = location[len("file:") :] if location.startswith("file:") else location
    full = os.path.join(cwd, path)
    try:
        with open(full, "rb") as f:
            source = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror} (check -c/--config)") from None
    try:
        tree = ast.parse(source, full)
    except SyntaxError as e:
        raise ConfigError(f"{path}:{e.lineno}: {e.msg} (in config file)") from None
    namespace: dict[str, Any] = {"__file__": full, "__name__": "__config__"}
    exec(compile(tree, full, "exec"), namespace)  # user code: its own errors keep their traceback
    return namespace, _imported_names(tree), path


def _check_hook(key: str, value: Any, where: str) -> Callable[..., Any]:
    """A hook must be a function taking gunicorn's arguments; post_request may take 2 to 4."""
    hook = _HOOKS[key]
    wanted = hook.arities or (len(hook.args),)
    func: Callable[..., Any] = value
    if not callable(value):
        raise ConfigError(f"{where} is a server hook: make it a function of ({', '.join(hook.args)}), "
                          f"got {c.got(value)}")  # fmt: skip
    try:
        params = inspect.signature(value).parameters.values()
    except (TypeError, ValueError):
        return func  # a builtin or C callable: trust it
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return func
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    fits = [n for n in wanted if required <= n <= len(positional)]
    if not fits:
        raise ConfigError(f"{where} must take {len(hook.args)} argument(s) ({', '.join(hook.args)}), as "
                          f"gunicorn calls it; it takes {len(positional)}")  # fmt: skip
    if key == "post_request" and max(fits) < 4:
        n = max(fits)
        return lambda worker, req, environ, resp: func(*(worker, req, environ, resp)[:n])
    return func


def _distance(a: str, b: str) -> int:
    """Edits (insert, delete, replace, swap two neighbours) from a to b."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i]
        for j, cb in enumerate(b, 1):
            row.append(min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb)))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _typo_of(name: str, known: list[str]) -> str | None:
    """The setting `name` is a slip of the keyboard from (one or two edits), if any: helper names
    that merely contain a setting's name (`timeout_str`, `use_loglevel`) are not slips."""
    most = 2 if len(name) >= 6 else 1
    close = [(_distance(name, k), k) for k in known if abs(len(k) - len(name)) <= most]
    hits = sorted((d, k) for d, k in close if 0 < d <= most)
    return hits[0][1] if hits else None


def _from_config_file(
    location: str, cwd: str
) -> tuple[Source, dict[str, Callable[..., Any]], list[tuple[int, str]]]:
    """A gunicorn.conf.py: settings are module-level names (refork's or gunicorn's), hooks are
    functions; every other name is ignored, as gunicorn ignores it, with one WARNING for the names
    that look like a misspelled setting."""
    namespace, skip, label = _read_config_file(location, cwd)
    values: Source = []
    hooks: dict[str, Callable[..., Any]] = {}
    notes: list[tuple[int, str]] = []
    misspelled = []
    known = sorted(_NAMES | set(gunicorn.BY_NAME) | set(_HOOKS))
    for key, value in namespace.items():
        if key.startswith("_") or key in skip or isinstance(value, types.ModuleType):
            continue
        where = f"{key} in {label}"
        key = key.replace("-", "_")
        if key in _HOOKS:
            hooks[key] = _check_hook(key, value, where)
        elif key in gunicorn.BY_NAME and gunicorn.BY_NAME[key].how == "hook":
            notes.append((INFO, f"{where}: {gunicorn.BY_NAME[key].note}"))
        elif key in _FILE_CHECKS:
            values.append((key, _FILE_CHECKS[key](value, where), where))
        elif key in _NAMES:
            values.append((key, value, where))
        elif key in gunicorn.BY_NAME:
            values.append((_GUNICORN + key, value, where))
        elif not inspect.isclass(value) and (typo := _typo_of(key, known)):
            misspelled.append(f"{key} (did you mean {typo!r}?)")
    if "pre_exec" in hooks:
        notes.append((INFO, f"pre_exec in {label}: {gunicorn.BY_NAME['pre_exec'].note}"))
    if misspelled:
        notes.append((WARNING, f"{label}: ignored names that look like misspelled settings: "
                               + ", ".join(misspelled)))  # fmt: skip
    return values, hooks, notes


# --------------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------------


def _env_defaults(environ: Mapping[str, str]) -> Source:
    """What gunicorn takes from the environment as defaults."""
    out: Source = []
    if environ.get("WEB_CONCURRENCY"):
        out.append(("workers", environ["WEB_CONCURRENCY"], "WEB_CONCURRENCY"))
    if environ.get("PORT", "").strip().isdigit():
        out.append(("bind", [f"0.0.0.0:{environ['PORT'].strip()}"], "PORT"))
    if environ.get("FORWARDED_ALLOW_IPS"):
        out.append(("forwarded_allow_ips", environ["FORWARDED_ALLOW_IPS"], "FORWARDED_ALLOW_IPS"))
    return out


def _from_env(environ: Mapping[str, str]) -> Source:
    """REFORK_<SETTING>; unknown REFORK_* names are left alone unless they look like a typo."""
    by_env = {s.env: s.name for s in SETTINGS}
    out = []
    for key, value in environ.items():
        if not key.startswith("REFORK_"):
            continue
        if key in by_env:
            out.append((by_env[key], value, key))
        else:
            # strict cutoff, on the part after the prefix: other tools (and refork itself) may use
            # REFORK_* names of their own
            hint = _did_you_mean(key[7:], [env[7:] for env in by_env], cutoff=0.75, shown="REFORK_{}")
            if hint:
                raise ConfigError(f"unknown environment variable {key}{hint}")
    return out


# --------------------------------------------------------------------------------------------
# Putting it together
# --------------------------------------------------------------------------------------------


def _apply(config: Config, sources: Source) -> None:
    """Each value through the table (gunicorn's names) and its setting's coercer, in order."""
    notes: dict[str, tuple[int, str]] = {}  # one line per gunicorn setting: the last source's
    for name, value, where in sources:
        if name.startswith(_GUNICORN):
            pairs, lines = gunicorn.translate(name[len(_GUNICORN) :], value, where, _NAMES.__contains__)
            for line in lines:
                notes[name] = line
        else:
            pairs = [(name, value)]
        for target, raw in pairs:
            if raw is None and target not in ("proc_name", "user", "group", "umask", "worker_connections"):
                continue  # gunicorn's None: the default
            setattr(config, target, _coerce(config, target, raw, where))
            config.sources[target] = where
    config.notes += list(notes.values())


def _coerce(config: Config, name: str, raw: Any, where: str) -> Any:
    return setting_named(name).coerce(raw, where)


def _worker_class(config: Config) -> None:
    """What -k means for refork: the interface, or the threads of a gevent/eventlet worker."""
    kind = pc.WORKER_CLASSES[config.worker_class]
    where = config.sources.get("worker_class", "worker_class")
    if config.worker_class.startswith("uvicorn") and "access_log_format" not in config.sources:
        config.access_log_format = "uvicorn"  # what uvicorn's worker logs under gunicorn
        config.sources["access_log_format"] = where
        if config.access_logfile is not None:
            config.notes.append((INFO, f"{where} {config.worker_class}: {UVICORN_ACCESS}"))
    if kind == pc.ASGI and "interface" not in config.sources:
        config.interface = "asgi"
        config.sources["interface"] = where
    elif kind == pc.GREEN:
        if "threads" not in config.sources:
            config.threads = min(config.worker_connections or GREEN_THREADS, MOST_GREEN_THREADS)
            config.sources["threads"] = where
            origin = (
                f"from worker_connections {config.worker_connections}"
                if config.worker_connections
                else f"worker_connections unset: {GREEN_THREADS}"
            )
            how = (
                f"{config.threads} threads per worker ({origin}, at most {MOST_GREEN_THREADS}; --threads "
                "sets it)"
            )
        else:
            how = f"--threads {config.threads}"
        config.notes.append((
            WARNING,
            f"{where} {config.worker_class}: refork does not monkey-patch (it forks a warm, preloaded "
            f"app, and a patched runtime would not survive that); the app runs on {how}, so a "
            "blocking call holds a thread, not the worker",
        ))  # fmt: skip


def _forwarded_client(config: Config) -> None:
    """--forwarded-client auto: what the server the settings were written for did with a trusted
    proxy's X-Forwarded-For (gunicorn: the scheme only; its uvicorn workers: the client too); and
    one line when every hop is trusted, since a client then chooses its own address."""
    allow = config.forwarded_allow_ips
    given = config.sources.get("forwarded_allow_ips")
    if config.forwarded_client == "auto" and given is not None:  # (unset: refork's default trust, on)
        uvicorn = config.worker_class.startswith("uvicorn")  # uvicorn.workers.*, uvicorn_worker.*
        config.forwarded_client = "on" if uvicorn else "off"
        config.sources["forwarded_client"] = f"auto: {given} with -k {config.worker_class}"
        if config.forwarded_client == "off" and allow:
            config.notes.append((INFO, f"{given}: {SCHEME_ONLY}"))
    if config.forwarded_client != "off" and any(entry == "*" or entry.endswith("/0") for entry in allow):
        where = given or config.sources.get("forwarded_client", "forwarded_client")
        config.notes.append((WARNING, f"{where}: {ANY_CLIENT}"))


def load_config(argv: list[str], environ: Mapping[str, str] = os.environ, cwd: str | None = None) -> Config:
    """Build the Config: defaults < environment defaults < pyproject < config file <
    GUNICORN_CMD_ARGS < REFORK_* < CLI."""
    cwd = cwd or os.getcwd()
    cli_values, config_file = parse_args(argv)
    env_args: Source = []
    if environ.get("GUNICORN_CMD_ARGS", "").strip():
        try:
            words = shlex.split(environ["GUNICORN_CMD_ARGS"])
        except ValueError as e:
            raise ConfigError(f"GUNICORN_CMD_ARGS: {e}") from None
        env_args, env_config = parse_args(words, "GUNICORN_CMD_ARGS")
        config_file = config_file or env_config
    sources: Source = _env_defaults(environ) + _from_pyproject(cwd)
    hooks: dict[str, Callable[..., Any]] = {}
    notes: list[tuple[int, str]] = []
    if config_file is None and os.path.isfile(os.path.join(cwd, DEFAULT_CONFIG_FILE)):
        config_file = DEFAULT_CONFIG_FILE
        notes.append((INFO, f"reading ./{DEFAULT_CONFIG_FILE} (as gunicorn does without -c)"))
    if config_file:
        file_values, hooks, file_notes = _from_config_file(config_file, cwd)
        sources += file_values
        notes += file_notes
    sources += env_args + _from_env(environ) + cli_values

    config = Config()
    config.notes = notes
    _apply(config, sources)
    config.hooks = hooks
    _worker_class(config)
    _forwarded_client(config)
    if config.pidfile:  # paths the monitor uses are relative to where it started, not --chdir
        config.pidfile = os.path.join(cwd, config.pidfile)
    config.reload_dirs = [os.path.join(cwd, d) for d in config.reload_dirs]
    config.reload_extra_files = [os.path.join(cwd, f) for f in config.reload_extra_files]
    if not config.app and not config.print_config:
        raise ConfigError("no APP given: run refork [OPTIONS] module:app (e.g. refork mysite.wsgi:app)")
    if not config.bind:
        raise ConfigError("no address to listen on: give at least one -b/--bind")
    return config


def reloaded(current: Config, new: Config) -> tuple[Config, list[str], list[str]]:
    """A re-read config for HUP: (new with RESTART_ONLY kept from current, changed, kept names)."""
    names = [s.name for s in SETTINGS if s.name not in ("check_config", "print_config")]
    changed = [n for n in names if n not in RESTART_ONLY and getattr(new, n) != getattr(current, n)]
    kept = [n for n in RESTART_ONLY if getattr(new, n) != getattr(current, n)]
    return replace(new, **{n: getattr(current, n) for n in RESTART_ONLY}), changed, kept


def describe(config: Config) -> str:
    """`name = value  # where it came from` lines (Python literals, so they can seed a config
    file); hooks by name."""
    rows = []
    for f in fields(config):
        if f.name in NOT_SETTINGS[1:]:
            continue
        value = getattr(config, f.name)
        if f.name == "hooks":
            rows.append((f"hooks = {sorted(value)!r}", "config file" if value else "none"))
        else:
            rows.append((f"{f.name} = {value!r}", config.sources.get(f.name, "default")))
    width = min(60, max(len(text) for text, _ in rows))
    return "\n".join(f"{text:<{width}}  # {where}" for text, where in rows)
