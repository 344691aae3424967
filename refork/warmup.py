"""Warm the app inside the mold, before the first fork, so every worker inherits the warm heap."""

from __future__ import annotations

import logging
import time
from typing import Any

from refork.config import Config

log = logging.getLogger("refork")
# CPython 3.12+ specializes an instruction on its second run: after one pass, every worker would
# still write the specialized form into the shared code objects itself.
PASSES = 2


def run_warmup(app: Any, interface: str, config: Config) -> None:
    """Send config.warmup requests through the app (no socket) PASSES times, then the warmup hook."""
    if config.warmup:
        started = time.monotonic()
        if interface == "asgi":
            from refork.asgi import warmup_asgi

            results = warmup_asgi(app, config.warmup * PASSES, config)
        else:
            from refork.wsgi import warmup_wsgi

            results = warmup_wsgi(app, config.warmup * PASSES, config)
        summary = ", ".join(f"{path} {status}" for path, status in results[: len(config.warmup)])
        log.info("warm-up: %s (%d passes, %.0f ms)", summary, PASSES, (time.monotonic() - started) * 1000)
    hook = config.hooks.get("warmup")
    if hook is not None:
        hook(app)
