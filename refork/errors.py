"""The one exception every layer may raise for a user's mistake, in a module that imports nothing.

Modules that only need to say "this setting is wrong" import it from here, not from refork.config,
so that raising it never pulls the whole configuration machinery (or an import cycle) along.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A user mistake in configuration: printed as one line, exit status 2, no traceback."""


__all__ = ["ConfigError"]
