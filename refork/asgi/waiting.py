"""The futures an ASGI receive() or send() waits on while its connection has nothing for it."""

from __future__ import annotations

import asyncio


def wake(waiter: asyncio.Future[None] | None) -> None:
    """Let the receive() or send() waiting on `waiter` (if any, and not cancelled) go on."""
    if waiter is not None and not waiter.done():
        waiter.set_result(None)
