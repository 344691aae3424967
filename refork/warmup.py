"""Warm the app inside the mold, before the first fork, so every worker inherits the warm heap."""

from __future__ import annotations

import logging
import time
from typing import Any

from refork.config import Config

log = logging.getLogger("refork")


def run_warmup(app: Any, interface: str, config: Config) -> None:
    """Send config.warmup requests through the app (no socket), then the user's warmup(app) hook."""
    if config.warmup:
        started = time.monotonic()
        if interface == "asgi":
            from refork.asgi import warmup_asgi

            results = warmup_asgi(app, config.warmup, config)
        else:
            from refork.wsgi import warmup_wsgi

            results = warmup_wsgi(app, config.warmup, config)
        summary = ", ".join(f"{path} {status}" for path, status in results)
        log.info("warm-up: %s (%.0f ms)", summary, (time.monotonic() - started) * 1000)
    hook = config.hooks.get("warmup")
    if hook is not None:
        hook(app)
