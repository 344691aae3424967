"""The exceptions every layer may raise for a user's mistake, in a module that imports nothing.

Modules that only need to say "this setting is wrong" import it from here, not from refork.config,
so that raising it never pulls the whole configuration machinery (or an import cycle) along.
"""

from __future__ import annotations


class ConfigError(Exception):
    """A user mistake in configuration: printed as one line, exit status 2, no traceback."""


class StartupError(Exception):
    """A worker cannot start, for a reason its message says in full (an ASGI app's lifespan
    startup failed, say): logged as one line, no traceback; the monitor names it if the server
    cannot start at all."""


__all__ = ["ConfigError", "StartupError"]
