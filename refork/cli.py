"""The `refork` command: build the Config (flags included) and hand it to the monitor or a mode.

refork.config owns the flags (they are generated from its settings table); this module only
decides what to run. It imports config, never the reverse.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial

from refork.config import Config, describe, load_config
from refork.errors import ConfigError

SUBCOMMANDS = ("status", "refork", "reload", "ttin", "ttou")


def check_config(config: Config) -> int:
    """--check-config: load and warm the app the way a mold does, then check what a fork would copy.

    The TLS files are loaded too. With --fork-safety strict a connection or thread left open is
    an error (exit 2): the guard a CI job runs so that nobody adds a load-time connection unnoticed.
    """
    from refork.loading import app_traceback, change_directory
    from refork.logs import check_log_files, log_notes, setup_logging
    from refork.process.mold import load_checked
    from refork.serving import check_static
    from refork.serving.tls_context import check as check_tls

    check_log_files(config)
    setup_logging(replace(config, capture_output=False))  # its verdict goes to the terminal
    log_notes(config)
    check_static(config)  # the --static directories exist (under --chdir: before going there)
    change_directory(config.chdir)
    check_tls(config)  # the certificate and key load (one line and exit 2 if not)
    try:
        _, interface, hazards = load_checked(config, set(), "the loaded app")
    except ConfigError:
        raise
    except Exception as e:  # the app's own import failed: its traceback, from its own frames
        print(app_traceback(e), file=sys.stderr)
        print(f"refork: error: the app failed to load: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    note = f"; fork safety: {len(hazards)} warning(s) above" if hazards else ""
    print(f"config ok: {config.app} ({interface}){note}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `refork` and `python -m refork`; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        from refork import status

        return status.run(argv)
    try:
        config = load_config(argv)
        for item in config.raw_env:  # -e KEY=VALUE: before the app is imported
            key, _, value = item.partition("=")
            os.environ[key] = value
        if config.print_config:
            try:
                print(describe(config), flush=True)
            except BrokenPipeError:  # `refork --print-config | head`: the reader left, that's fine
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if config.check_config:
            return check_config(config)
        from refork.loading import check_app_path
        from refork.serving import check_static, check_wsgi_loop

        check_wsgi_loop(config)  # --wsgi-loop native without the extension: exit 2, one line
        check_app_path(config.app, config.chdir, config.pythonpath)  # before binding: one line
        check_static(config)  # a --static directory that does not exist: exit 2, one line
        from refork.process.monitor import run

        return run(config, partial(load_config, argv, os.environ, os.getcwd()))
    except ConfigError as e:
        print(f"refork: error: {e}", file=sys.stderr)
        return 2
