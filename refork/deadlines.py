"""A request's own deadlines, for app code: ``refork.extend_deadline(seconds)``.

The connection loops set :data:`current` to the request's token right around the app call (the
WSGI app thread; each ASGI request's task gets its own context copy), so app code finds its
request without passing anything. The worker installs the function that moves a request's
deadlines (:meth:`refork.process.slots.AppClock.extend`). It imports nothing of refork, so any
layer may read it and ``import refork`` stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextvars import ContextVar

# The request the running code serves (a token of the worker's AppClock); None outside one.
current: ContextVar[object | None] = ContextVar("refork_request", default=None)


class _EngineRequest:
    """:data:`current` while the native engine (refork._native.Engine) serves: the request it has
    in the app, if any. The engine accounts its requests in the worker's slot itself; the clock
    registers one (a token like any other) only when something asks about it
    (:func:`extend_deadline`, ``--request-timeout``): see AppClock.adopt."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "refork.deadlines.ENGINE"


ENGINE = _EngineRequest()


class TimedOut(Exception):
    """Raised into the app code of a request blocked past ``--timeout`` (the monitor's SIGABRT, on
    that thread), as gunicorn's sync worker does: the request layer answers it with a 500 if the
    response has not started, else closes the connection; then the worker exits. An Exception, so
    that a framework's error handling (Django's, Flask's) may answer it as its own 500."""


_extend: Callable[[object, float], bool] | None = None
_answer_timed_out: Callable[[], None] | None = None


def install(extend: Callable[[object, float], bool] | None) -> None:
    """The worker's way to push a request's deadlines (None: not serving)."""
    global _extend
    _extend = extend


def on_timeout(answer: Callable[[], None] | None) -> None:
    """What answers the requests in the app of a worker aborted past --timeout from a thread that
    is not theirs (a loop with app threads sets it: refork.serving.wsgi.timed_out)."""
    global _answer_timed_out
    _answer_timed_out = answer


def answer_timed_out() -> None:
    """Answer them (the worker's SIGABRT handler, on the loop's thread, right before it exits)."""
    if _answer_timed_out is not None:
        _answer_timed_out()


def extend_deadline(seconds: float) -> bool:
    """Give the request this code serves `seconds` more before its deadlines.

    Both deadlines move by `seconds`, added to what the request had (like Pitchfork's
    ``extend_deadline``; calling it twice adds twice): the soft one (``--request-timeout``: the
    log line with the stack and the worker's graceful replacement) and the request's share of the
    hard one (``--timeout``: the worker is killed). Other requests on the worker keep theirs.

    Returns True when a request was extended, False when the caller serves no request of a refork
    worker (a unit test, a management command, another server, a thread the app started itself):
    library code may call it unconditionally, as Pitchfork's ``env["pitchfork.timeout"]&.``
    lets Ruby code do. A negative, infinite or NaN `seconds` raises ValueError.
    """
    amount = float(seconds)
    if not math.isfinite(amount) or amount < 0:
        raise ValueError(f"extend_deadline(): seconds must be a finite number >= 0, not {seconds!r}")
    token = current.get()
    extend = _extend
    if token is None or extend is None:
        return False
    return extend(token, amount)
