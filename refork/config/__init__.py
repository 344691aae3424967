"""One configuration object, built from defaults, pyproject.toml, a config file, REFORK_* env and the CLI.

- refork.config.table: the Config dataclass, the one table of settings (flags, env, help, checks),
  whose fields are declared there and in refork.config.server_settings, protocol_settings and
  process_settings; and the server hooks;
- refork.config.gunicorn: every gunicorn setting mapped to what refork does (docs/from-gunicorn.md);
- refork.config.settings: how a setting is declared and turned into argparse arguments and docs rows;
- refork.config.coercers: the value checks, one line of error each (process_coercers: those of
  gunicorn's process and logging settings);
- refork.config.load: the sources and their precedence, HUP's reloaded(), --print-config's describe();
- refork.config.docs: the generated options table of docs/configuration.md.

ConfigError lives in refork.errors so that raising it never imports this package.
"""

from __future__ import annotations

from refork.config.coercers import cpu_quota, parse_size
from refork.config.gunicorn import gunicorn_value
from refork.config.load import build_parser, describe, load_config, parse_args, reloaded
from refork.config.table import (
    HOOK_NAMES,
    HOOKS,
    NOT_SETTINGS,
    RESTART_ONLY,
    SETTINGS,
    Allocator,
    Config,
    ForkSafety,
    Interface,
    LogLevel,
    Loop,
    MemoryMetric,
    hard_timeout,
    idle_mold_linger,
    setting_named,
)
from refork.errors import ConfigError

__all__ = [
    "HOOK_NAMES",
    "HOOKS",
    "NOT_SETTINGS",
    "RESTART_ONLY",
    "SETTINGS",
    "Allocator",
    "Config",
    "ConfigError",
    "ForkSafety",
    "Interface",
    "LogLevel",
    "Loop",
    "MemoryMetric",
    "build_parser",
    "cpu_quota",
    "describe",
    "gunicorn_value",
    "hard_timeout",
    "idle_mold_linger",
    "load_config",
    "parse_args",
    "parse_size",
    "reloaded",
    "setting_named",
]
