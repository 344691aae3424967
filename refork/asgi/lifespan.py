"""The ASGI ``lifespan`` scope: startup before serving, shutdown at graceful stop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from refork.asgi.scope import ASGI_INFO
from refork.errors import StartupError

log = logging.getLogger("refork")


class LifespanFailure(StartupError):
    """The app reported (or raised during) lifespan startup: the worker must not serve."""


class Lifespan:
    """Drive the app's ``lifespan`` scope: startup before serving, shutdown at graceful stop.

    An app that raises on the lifespan scope before its first ``receive()`` does not implement
    it: logged at debug, serving goes on. Raising after receiving ``lifespan.startup`` without
    answering is a startup failure. ``state`` is the dict every request scope copies.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self.supported = True
        self._task: asyncio.Task[None] | None = None
        self._inbox: list[dict[str, Any]] = []
        self._inbox_ready: asyncio.Future[None] | None = None
        self._reply: asyncio.Future[dict[str, Any]] | None = None
        self._received = False
        self._phase = "startup"

    async def startup(self) -> None:
        """Run lifespan.startup; raise LifespanFailure if the app reports or raises a failure."""
        loop = asyncio.get_running_loop()
        scope = {"type": "lifespan", "asgi": ASGI_INFO.copy(), "state": self.state}
        self._task = loop.create_task(self._run(scope))
        message = await self._exchange("startup")
        if message is None:
            return
        if message["type"] == "lifespan.startup.failed":
            raise LifespanFailure(f"ASGI lifespan startup failed: {message.get('message', '')}")
        if message["type"] != "lifespan.startup.complete":
            raise LifespanFailure(f"unexpected lifespan message during startup: {message['type']!r}")

    async def shutdown(self) -> None:
        """Run lifespan.shutdown if startup completed; failures are logged, never raised."""
        if not self.supported or self._task is None or self._task.done():
            return
        message = await self._exchange("shutdown")
        if message is not None and message["type"] == "lifespan.shutdown.failed":
            log.error("ASGI lifespan shutdown failed: %s", message.get("message", ""))

    async def _exchange(self, phase: str) -> dict[str, Any] | None:
        """Deliver lifespan.<phase>; return the app's answer, or None if it does not do lifespan."""
        assert self._task is not None
        self._phase = phase
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._reply = reply
        self._inbox.append({"type": f"lifespan.{phase}"})
        if self._inbox_ready is not None and not self._inbox_ready.done():
            self._inbox_ready.set_result(None)
        pending: set[asyncio.Future[Any]] = {reply, self._task}
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if reply.done():
            return reply.result()
        reply.cancel()
        if self.supported:
            log.warning("ASGI lifespan task returned without answering lifespan.%s", phase)
        return None

    async def _run(self, scope: dict[str, Any]) -> None:
        try:
            await self.app(scope, self._receive, self._send)
        except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
            raise  # a fast stop cancels the task waiting for lifespan.shutdown: not an app error
        except BaseException as exc:
            if not self._received:
                self.supported = False
                log.debug("ASGI app does not support lifespan (%s: %s)", type(exc).__name__, exc)
                return
            reply = self._reply
            if reply is None or reply.done():
                log.error("Exception in ASGI lifespan task", exc_info=exc)
                return
            log.error("Exception in ASGI lifespan %s", self._phase, exc_info=exc)
            detail = f"{type(exc).__name__}: {exc}"
            reply.set_result({"type": f"lifespan.{self._phase}.failed", "message": detail})
        else:
            if not self._received:
                self.supported = False  # returned without looking: no lifespan support

    async def _receive(self) -> dict[str, Any]:
        self._received = True
        while not self._inbox:
            self._inbox_ready = asyncio.get_running_loop().create_future()
            await self._inbox_ready
        return self._inbox.pop(0)

    async def _send(self, message: dict[str, Any]) -> None:
        reply = self._reply
        if reply is not None and not reply.done():
            reply.set_result(message)
