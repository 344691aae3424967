"""The Python stack of a request that overstayed --request-timeout, for the log.

Where the request runs decides what can be shown:

- a WSGI pool thread (``--threads`` > 1): that thread's current frame, from
  ``sys._current_frames()``, read by the loop thread while the app thread is still stuck;
- an ASGI request awaiting something (the event loop still runs): its task's chain of awaits,
  from the request's coroutine down to the innermost awaitable;
- the loop thread itself, blocked in the app (``--threads 1`` WSGI, or ASGI code that never
  awaits): nothing runs on that thread to look, so the monitor sees the deadline pass on the slots
  page and sends SIGUSR2; the worker's handler runs on that thread between two bytecodes and
  `frame` is the frame it interrupted. Code stuck inside a C call that never returns to the
  interpreter (and is not interrupted by a signal) runs no handler: no stack, and ``--timeout``
  kills the worker.
"""

from __future__ import annotations

import sys
import threading
import traceback
from types import FrameType
from typing import Any

from refork.process.slots import InFlight


def request_stack(token: InFlight, interrupted: FrameType | None = None) -> str:
    """The stack of the code running `token`'s request, innermost call last (traceback style)."""
    if token.thread != threading.get_ident():
        frame = sys._current_frames().get(token.thread)
        if frame is None:
            return "  (its thread is gone)\n"
        return f"  thread {token.thread:#x}:\n" + "".join(traceback.format_stack(frame))
    task = _task_of(token)
    if task is not None and task is not _running_task():
        return f"  task {_task_name(task)}, awaiting:\n" + _await_chain(task)
    if interrupted is not None:
        return "  the loop thread, blocked in the app:\n" + "".join(traceback.format_stack(interrupted))
    return "  (the loop thread is running it: no stack from here)\n"


def _running_task() -> Any:
    import asyncio

    loop = asyncio._get_running_loop()
    return asyncio.current_task(loop) if loop is not None else None


def _task_of(token: InFlight) -> Any:
    """The asyncio task whose request coroutine holds `token` (the ASGI loop's HttpCycle.run)."""
    if "asyncio" not in sys.modules:
        return None
    import asyncio

    loop = asyncio._get_running_loop()
    if loop is None:
        return None
    for task in asyncio.all_tasks(loop):
        frame = getattr(task.get_coro(), "cr_frame", None)
        if frame is None:
            continue
        owner = frame.f_locals.get("self")
        if owner is not None and getattr(owner, "token", None) is token:
            return task
    return None


def _task_name(task: Any) -> str:
    get_name = getattr(task, "get_name", None)
    return str(get_name()) if get_name is not None else repr(task)


def _await_chain(task: Any) -> str:
    """A task's awaits from its coroutine to the innermost suspended frame (asyncio's own
    Task.print_stack shows only the outermost frame of a suspended coroutine)."""
    frames: list[FrameType] = []
    awaitable: Any = task.get_coro()
    seen = 0
    while awaitable is not None and seen < 200:
        seen += 1
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "gi_frame", None)
        if frame is not None:
            frames.append(frame)
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "gi_yieldfrom", None)
    summary = traceback.StackSummary.extract((f, f.f_lineno) for f in frames)
    return "".join(summary.format())
