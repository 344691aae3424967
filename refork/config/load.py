"""Loading: every source yields raw values, one coercer per setting checks them, into one Config.

Precedence, lowest first: defaults, WEB_CONCURRENCY (workers only), ``[tool.refork]`` in
./pyproject.toml, the ``-c`` Python config file, ``REFORK_*`` environment variables, CLI flags.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from typing import Any, NoReturn

from refork import __version__
from refork.config.coercers import got
from refork.config.settings import add_arguments, given
from refork.config.table import HOOK_NAMES, RESTART_ONLY, SETTINGS, Config, setting_named
from refork.errors import ConfigError

# --------------------------------------------------------------------------------------------
# Sources: each yields (setting name, raw value, where it came from); the setting's coercer checks it.
# --------------------------------------------------------------------------------------------

Source = list[tuple[str, Any, str]]

_NAMES = [s.name for s in SETTINGS]


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see refork --help)")


def build_parser() -> argparse.ArgumentParser:
    """The `refork` command line: one argument per setting, defaults suppressed (absent = not given)."""
    parser = _Parser(
        prog="refork",
        usage="refork [OPTIONS] APP\n       refork status|refork|reload|ttin|ttou [...]",
        description="A pre-fork HTTP server for Python WSGI/ASGI apps, with reforking.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"refork {__version__}")
    parser.add_argument("-c", "--config", dest="config_file", metavar="FILE", help="Python config file")
    add_arguments(parser, SETTINGS)
    return parser


def parse_args(argv: list[str]) -> tuple[Source, str | None]:
    """Flags given -> [(setting, raw value, flag name)], plus the -c config file path if any."""
    namespace = build_parser().parse_args(argv)
    return given(namespace, SETTINGS), getattr(namespace, "config_file", None)


def _did_you_mean(name: str, candidates: list[str], cutoff: float = 0.7, shown: str = "{}") -> str:
    """' (did you mean 'x'?)' for a close candidate, else ''; shown formats the suggestion."""
    import difflib  # only on the error path

    close = difflib.get_close_matches(name, candidates, n=1, cutoff=cutoff)
    return f" (did you mean {shown.format(close[0])!r}?)" if close else ""


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
        if name not in _NAMES:
            hint = _did_you_mean(name, list(_NAMES))
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


def _from_config_file(path: str) -> tuple[Source, dict[str, Callable[..., Any]]]:
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
    values: Source = []
    hooks: dict[str, Callable[..., Any]] = {}
    for key, value in namespace.items():
        if key.startswith("_") or key in skip or isinstance(value, types.ModuleType):
            continue
        name = key.replace("-", "_")
        if name in HOOK_NAMES:
            if not callable(value):
                raise ConfigError(f"{key} in {path} is a server hook: make it a function, got {got(value)}")
            hooks[name] = value
        elif name in _NAMES:
            values.append((name, value, f"{key} in {path}"))
        else:
            hint = _did_you_mean(name, list(_NAMES) + list(HOOK_NAMES))
            raise ConfigError(
                f"unknown setting {key!r} in {path}{hint}; prefix helper names with '_' to keep them"
            )
    return values, hooks


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


def load_config(argv: list[str], environ: Mapping[str, str] = os.environ, cwd: str | None = None) -> Config:
    """Build the Config: defaults < WEB_CONCURRENCY < pyproject < -c file < REFORK_* < CLI."""
    cwd = cwd or os.getcwd()
    cli_values, config_file = parse_args(argv)
    sources: Source = []
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
        setattr(config, name, setting_named(name).coerce(value, where))
    config.hooks = hooks
    if config.pidfile:  # paths the monitor uses are relative to where it started, not --chdir
        config.pidfile = os.path.join(cwd, config.pidfile)
    config.reload_dirs = [os.path.join(cwd, d) for d in config.reload_dirs]
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
    """`name = value` lines (Python literals, so they can seed a config file); hooks by name."""
    lines = []
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name == "hooks":
            lines.append(f"hooks = {sorted(value)!r}")
        else:
            lines.append(f"{f.name} = {value!r}")
    return "\n".join(lines)


