"""Warm-up of a WSGI app: in the mold, before forking, so the workers inherit what it filled."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from refork.config import Config
from refork.http.body import EMPTY_INPUT
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies
from refork.wsgi.environ import EnvironBuilder
from refork.wsgi.response import run_wsgi


def _discard(data: bytes) -> None:
    pass


def warmup_wsgi(app: Callable[..., Any], requests: list[Request], config: Config) -> list[int]:
    """Run each request through the app in-process (lazy imports, caches); returns the statuses.

    The real response path, so its caches (statuses, headers) are filled before the fork too.
    """
    builder = EnvironBuilder(
        server=("localhost", 80),
        root_path=config.root_path,
        multithread=config.threads > 1,
        proxies=TrustedProxies([]),
    )
    return [
        run_wsgi(app, builder.build(request, EMPTY_INPUT, ("127.0.0.1", 0)), request, _discard)[0]
        for request in requests
    ]
