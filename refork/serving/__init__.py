"""Connection loops: accept, read, parse, call the app, write. One per interface.

A worker process hands its listening sockets, the app and a :class:`WorkerControl` to
:func:`serve`. The loop knows nothing about processes: everything it must tell the worker (a
request started or finished, a safe point was reached) goes through the control object. A native
(Rust) loop can replace a Python one here without touching process management. What both loops
promise a client (timeouts, the drain on stop, the access-log line, the clean-up after a fork) is
written once, in :mod:`refork.serving.connection`.
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any

from refork.config import Config
from refork.errors import ConfigError
from refork.serving.contract import WorkerControl

__all__ = ["WorkerControl", "check_static", "check_tls", "check_wsgi_loop", "serve", "wsgi_loop"]

log = logging.getLogger("refork")
PYTHON_SWITCH_INTERVAL = 0.005  # the interpreter's default


def serve(
    listeners: list[socket.socket], app: Any, interface: str, config: Config, control: WorkerControl
) -> None:
    """Serve until control says stop; interface is "wsgi" or "asgi" (already resolved).

    The loops are imported here, on demand: a WSGI worker never imports asyncio, and the monitor
    (which imports this package for its start-up checks) none of the HTTP layer.
    """
    from refork.serving.settings import ServingSettings

    if interface == "asgi":
        from refork.serving.asgi.server import serve_asgi

        app = _with_static(app, interface, config, control)
        serve_asgi(listeners, app, config, control, ServingSettings.for_worker(config, listeners, asgi=True))
        return
    settings = ServingSettings.for_worker(config, listeners)
    if config.switch_interval is not None:
        sys.setswitchinterval(config.switch_interval)  # this worker process only (forked from the mold)
    loop = wsgi_loop(config)
    # the native engines replay static answers themselves (the pool's on its I/O thread) when
    # nothing else must see their requests
    replay = loop == "native" and settings.request_end is None and settings.request_hooks is None
    app = _with_static(app, interface, config, control, replay)
    if loop == "native":
        control.ready_for_requests()  # no start-up work in the loop (the app was loaded and warmed)
        if int(config.threads) <= 1:  # the engine: the whole request path native
            from refork.serving.wsgi.engine_host import serve_wsgi_engine

            serve_wsgi_engine(listeners, app, config, control, settings)
        else:  # a pool of app threads fed by the engine's I/O thread
            from refork.serving.wsgi.pool_host import serve_wsgi_pool

            serve_wsgi_pool(listeners, app, config, control, settings)
    else:
        from refork.serving.wsgi.python_loop import serve_wsgi

        control.ready_for_requests()  # no start-up work in the loop (the app was loaded and warmed)
        serve_wsgi(listeners, app, config, control, settings)


def _with_static(
    app: Any, interface: str, config: Config, control: WorkerControl, replay: bool = False
) -> Any:
    """The app behind the --static mounts, if any (refork.serving.static_apps); `replay`: the
    native engine answers their plain requests again itself (native/src/static_files)."""
    if not config.static:
        return app
    from refork.serving.static_apps import static_files, wrap

    files = static_files(config)
    assert files is not None
    return wrap(app, interface, files, control.static_count, replay)


def check_static(config: Config) -> None:
    """At start-up, before binding: a --static directory that does not exist is one line, exit 2
    (relative to --chdir, where the workers run)."""
    from refork.serving.static import Mount

    for spec in config.static:
        try:
            Mount.parse(spec, config.chdir or ".")
        except ValueError as e:
            raise ConfigError(str(e)) from None


def wsgi_loop(config: Config) -> str:
    """The WSGI loop for this config, "native" or "python" (--wsgi-loop; auto: native when
    refork._native is built), logged at each worker start. ConfigError: native asked, not built."""
    from refork.serving.wsgi.choice import choose

    setting = str(config.wsgi_loop)
    loop = choose(setting)
    detail = []
    if loop == "native":
        detail.append("engine" if int(config.threads) <= 1 else f"engine, {int(config.threads)} app threads")
    if (interval := sys.getswitchinterval()) != PYTHON_SWITCH_INTERVAL:
        detail.append(f"GIL switch interval {interval * 1000:g} ms")
    log.info("WSGI loop: %s%s%s", loop, f" ({'; '.join(detail)})" if detail else "",
             " [auto]" if setting == "auto" else "")  # fmt: skip
    return loop


def check_wsgi_loop(config: Config) -> None:
    """At start-up: --wsgi-loop native without the extension is a config error (one line, exit 2).

    With --user/--group the monitor imports the WSGI Python loop and the standard library's
    common heavy modules here too: a mold that drops privileges before it imports the app (as a
    user who may not read the interpreter's prefix) then finds them imported already. Without
    them it does not: that would be memory the monitor keeps alone (docs/memory.md)."""
    from refork.serving.wsgi.choice import check

    if config.user is not None or config.group is not None:
        import asyncio  # noqa: F401
        import logging.handlers  # noqa: F401
        import subprocess  # noqa: F401
        import tempfile  # noqa: F401

        import refork.serving.wsgi.python_loop  # noqa: F401

    check(str(config.wsgi_loop))


def check_tls(config: Config) -> None:
    """At start-up and on reload: the TLS files load (ConfigError, one line, if not). ssl is
    imported only when a TLS setting is set: the monitor of a plain-HTTP server never loads it."""
    if config.certfile or config.keyfile or config.ca_certs or config.ciphers:
        from refork.serving.tls_context import check

        check(config)
