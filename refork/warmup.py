"""Warm the app inside the mold, before the first fork, so every worker inherits the warm heap."""

from __future__ import annotations

import logging
import time
from typing import Any

from refork.config import Config
from refork.http.events import Request

log = logging.getLogger("refork")
# CPython 3.12+ specializes an instruction on its second run: after one pass, every worker would
# still write the specialized form into the shared code objects itself.
PASSES = 2


def warmup_request(target: str) -> Request:
    """The GET a warm-up sends for one configured path ("/x?y=1"; a missing leading "/" is added)."""
    raw = target.encode("utf-8")
    if not raw.startswith(b"/"):
        raw = b"/" + raw
    path, _, query = raw.partition(b"?")
    return Request(
        method="GET",
        target=raw,
        path=path,
        query=query,
        http_version="1.1",
        headers=[(b"host", b"localhost"), (b"user-agent", b"refork-warmup")],
    )


def warm(app: Any, interface: str, paths: list[str], config: Config) -> list[tuple[str, int]]:
    """Send a GET for each path through the app, without a socket; (path, status) for each.

    The adapters are imported on demand: a WSGI mold never imports asyncio.
    """
    requests = [warmup_request(path) for path in paths]
    if interface == "asgi":
        from refork.asgi import warmup_asgi

        statuses = warmup_asgi(app, requests, config)
    else:
        from refork.wsgi import warmup_wsgi

        statuses = warmup_wsgi(app, requests, config)
    return list(zip(paths, statuses, strict=True))


def run_warmup(app: Any, interface: str, config: Config) -> None:
    """Send config.warmup requests through the app PASSES times, then call the warmup hook."""
    if config.warmup:
        started = time.monotonic()
        results = warm(app, interface, config.warmup * PASSES, config)
        summary = ", ".join(f"{path} {status}" for path, status in results[: len(config.warmup)])
        log.info("warm-up: %s (%d passes, %.0f ms)", summary, PASSES, (time.monotonic() - started) * 1000)
    hook = config.hooks.get("warmup")
    if hook is not None:
        hook(app)
