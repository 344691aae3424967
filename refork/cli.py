"""The `refork` command: parse flags into raw values, build the Config, hand it to the monitor.

Flags carry strings only; refork.config validates them so that a bad value gets the same
one-line message whether it came from the CLI, the environment or a file.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from typing import Any, NoReturn

from refork import __version__
from refork.config import Config, ConfigError, describe, load_config

SUBCOMMANDS = ("status", "refork", "reload", "ttin", "ttou")


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see refork --help)")


def build_parser() -> argparse.ArgumentParser:
    """All flags; dest is the Config field name, defaults are suppressed (absent = not given)."""
    p = _Parser(
        prog="refork",
        usage="refork [OPTIONS] APP\n       refork status|refork|reload|ttin|ttou [...]",
        description="A pre-fork HTTP server for Python WSGI/ASGI apps, with reforking.",
        argument_default=argparse.SUPPRESS,
        allow_abbrev=False,
    )
    add = p.add_argument
    add("app", nargs="?", metavar="APP", help="module:app, module:factory() or module (uses app/application)")
    add("--version", action="version", version=f"refork {__version__}")
    add("-c", "--config", dest="config_file", metavar="FILE", help="Python config file")
    add("--check-config", action="store_const", const=True, help="load the app, check fork safety, exit")
    add("--print-config", action="store_const", const=True, help="print the resolved config and exit")
    add("--reload", action="store_const", const=True, help="development: reload when a *.py file changes")
    add("--reload-dir", dest="reload_dirs", action="append", metavar="DIR", help="watch DIR (default: cwd)")

    g = p.add_argument_group("app").add_argument
    g("--interface", metavar="auto|wsgi|asgi", help="app interface (default: detect)")
    g("--chdir", metavar="DIR", help="change to DIR before loading the app")
    g("--pythonpath", action="append", metavar="DIRS", help="comma-separated dirs to add to sys.path")
    g("--root-path", metavar="PATH", help="SCRIPT_NAME / ASGI root_path for an app mounted below /")

    g = p.add_argument_group("server").add_argument
    g("-b", "--bind", action="append", metavar="ADDR", help="HOST:PORT, [V6]:PORT, :PORT, unix:PATH, fd://N")
    g("--backlog", metavar="N", help="listen() backlog")
    g("--forwarded-allow-ips", metavar="IPS", help="comma-separated proxies trusted for X-Forwarded-*")
    g("-w", "--workers", metavar="N|auto", help="worker processes (auto: CPU quota)")
    g("--threads", metavar="N", help="threads per WSGI worker")
    g("--timeout", metavar="S", help="kill a worker busy on one request longer than this")
    g("--graceful-timeout", metavar="S", help="time to finish in-flight requests on stop")
    g("--keepalive", metavar="S", help="idle keep-alive connection timeout")
    g("--header-timeout", metavar="S", help="time allowed to receive a request head")
    g("--spawn-timeout", metavar="S", help="time a new worker or mold has to report in")
    g("--max-requests", metavar="N", help="restart a worker after N requests (0: never)")
    g("--max-requests-jitter", metavar="N", help="random extra requests added to --max-requests")
    g("-n", "--name", dest="proc_name", metavar="NAME", help="process title prefix")
    g("--control-socket", metavar="PATH", help="unix socket for `refork status`")
    g("-p", "--pid", dest="pidfile", metavar="FILE", help="write the monitor's pid to FILE")
    g("--loop", metavar="auto|asyncio|uvloop", help="ASGI event loop")

    g = p.add_argument_group("HTTP limits").add_argument
    g("--limit-request-line", metavar="N", help="max request line bytes")
    g("--limit-request-fields", metavar="N", help="max header count")
    g("--limit-request-field-size", metavar="N", help="max header line bytes")
    g("--limit-request-body", metavar="SIZE", help="max body size, e.g. 100M (0: unlimited)")

    g = p.add_argument_group("logging").add_argument
    g("--access-logfile", metavar="FILE", help="access log file ('-': stdout; default: off)")
    g("--access-log-format", metavar="common|combined|json", help="access log format")
    g("--error-logfile", metavar="FILE", help="error log file ('-': stderr)")
    g("--log-level", metavar="LEVEL", help="debug, info, warning, error or critical")

    g = p.add_argument_group("memory").add_argument
    g("--immortalize", action=argparse.BooleanOptionalAction, help="immortalize the heap before fork")
    g("--warmup", action="append", metavar="PATH", help="request path sent through the app before fork")
    g("--refork-after", metavar="N,N,...|off", help="requests per generation before promoting a new mold")
    g("--refork-max-unavailable", metavar="N", help="workers replaced at once during a refork")
    g(
        "--mold-idle-exit",
        metavar="S|off",
        help="stop the mold after S idle seconds to free its memory; a worker is promoted when needed",
    )
    g(
        "--fork-safety",
        metavar="warn|strict|off",
        help="connections or threads alive at fork: log them (warn) or refuse to fork (strict)",
    )
    g("--max-worker-memory", metavar="SIZE", help="replace a worker above this, e.g. 512M (0: off)")
    g("--memory-metric", metavar="uss|pss", help="what --max-worker-memory measures")
    g("--memory-interval", metavar="S", help="seconds between memory samples")
    g("--allocator", metavar="system|jemalloc", help="malloc implementation")
    g("--malloc-trim", action=argparse.BooleanOptionalAction, help="malloc_trim() when idle (10 s apart)")
    g("--memray", metavar="DIR", help="write one memray capture per worker to DIR")
    return p


def parse_args(argv: list[str]) -> tuple[list[tuple[str, Any, str]], str | None]:
    """Flags given -> [(field, raw value, flag name)], plus the -c config file path if any."""
    parser = build_parser()
    ns = vars(parser.parse_args(argv))
    flag = {a.dest: (a.option_strings[-1] if a.option_strings else "APP") for a in parser._actions}
    config_file = ns.pop("config_file", None)
    return [(name, value, flag[name]) for name, value in ns.items()], config_file


def check_config(config: Config) -> int:
    """--check-config: load and warm the app the way a mold does, then check what a fork would copy.

    With --fork-safety strict a connection or thread left open is an error (exit 2): the guard
    a CI job runs so that nobody adds a load-time connection unnoticed.
    """
    from refork.loading import load_app, prepare_import_path, resolve_interface
    from refork.logs import setup_logging
    from refork.process import fork_check
    from refork.warmup import run_warmup

    setup_logging(config)
    with fork_check.tracing(config.fork_safety) as tracer:
        prepare_import_path(config.chdir, config.pythonpath)
        app = load_app(config.app)
        interface = resolve_interface(app, config.interface)
        run_warmup(app, interface, config)
    hazards = fork_check.inspect(tracer=tracer) if tracer is not None else []
    fork_check.judge(hazards, config.fork_safety, "the loaded app")
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
        if config.print_config:
            try:
                print(describe(config), flush=True)
            except BrokenPipeError:  # `refork --print-config | head`: the reader left, that's fine
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        if config.check_config:
            return check_config(config)
        from refork.process.monitor import run

        return run(config, partial(load_config, argv, os.environ, os.getcwd()))
    except ConfigError as e:
        print(f"refork: error: {e}", file=sys.stderr)
        return 2
