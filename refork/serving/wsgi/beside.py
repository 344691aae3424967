"""What the Python loop asks of whatever serves beside it: nothing (:class:`Alone`), or the native
engine of the host that owns the loop (refork.serving.wsgi.native_host.EngineSide), which serves
the plain connections while the loop serves the rest.

The loop holds this object only, never its host: the connections the engine hands over wait in
:attr:`Beside.handed` after a poll, for the loop to adopt, and a connection goes back to the
engine through :meth:`Beside.listener_for` and :meth:`Beside.hand_back`.
"""

from __future__ import annotations

from typing import Any, Protocol

from refork.serving.poller import Poller
from refork.serving.wsgi.conn import Conn
from refork.wsgi import EnvironBuilder

# A connection an engine hands over: fd, client, its listener's environ builder, the bytes the
# engine has not consumed, since, fresh, and the bytes of the worker's budget charged for them.
Adopted = tuple[int, Any, EnvironBuilder, bytes, float, bool, int]


class Beside(Protocol):
    """What serves beside the loop, as the loop calls it."""

    hands_back: bool  # a connection may go back to it (listener_for); False: the loop keeps them all
    handed: list[Adopted]  # what the engine handed over in the last poll: the loop adopts and clears it

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        """Wait up to `timeout` s for the loop's own ready fds (an engine serves its own meanwhile)."""

    def listener_for(self, conn: Conn) -> int | None:
        """A connection that may be between requests: the engine's listener it goes back to,
        None while it stays the loop's."""

    def hand_back(self, fd: int, client: Any, listener: int, since: float) -> None:
        """A connection the loop let go of (see listener_for): the engine's again."""

    def app_idle(self) -> bool:
        """No request of the engine's is in the app (with none of the loop's: a safe point)."""

    def free_threads(self) -> int | None:
        """App threads free for a new request, counted by the engine; None: the loop counts."""

    def drained(self) -> bool:
        """Nothing of the engine's is left (a draining loop may return)."""

    def begin_drain(self, until: float, take_backlog: bool) -> None:
        """The loop began its drain (until then); the engine drains with it."""

    def sweep(self, now: float) -> None:
        """The loop swept its deadlines; the engine sweeps its own."""

    def before_safe_point(self) -> None:
        """No thread of the engine's may run at the safe point (it may fork)."""

    def after_safe_point(self) -> None:
        """The safe point is over in the parent: the engine serves again."""

    def forked(self) -> None:
        """In the forked child: the engine's connections are the parent's."""

    def answer_timed_out(self) -> None:
        """The worker is aborted past --timeout: a 500 to the engine's requests in the app."""

    def shutdown(self) -> None:
        """The loop has shut down: release what the engine owns."""


class NoAppWork:
    """The hooks of :class:`Beside` as a side with no app threads or deadlines of its own answers
    them; a side that has some overrides its own (the engines' sides: their sweep, their safe
    point; the pool engine's app threads)."""

    def app_idle(self) -> bool:
        return True

    def free_threads(self) -> int | None:
        return None

    def sweep(self, now: float) -> None:
        pass

    def before_safe_point(self) -> None:
        pass

    def after_safe_point(self) -> None:
        pass

    def answer_timed_out(self) -> None:
        pass


class Alone(NoAppWork):
    """:class:`Beside` for a Python loop that serves every connection itself (--wsgi-loop python)."""

    hands_back = False

    def __init__(self, poller: Poller) -> None:
        self.poll = poller.poll  # (bound once: the loop calls it every turn)
        self.handed: list[Adopted] = []  # (always empty)

    def listener_for(self, conn: Conn) -> int | None:
        return None

    def hand_back(self, fd: int, client: Any, listener: int, since: float) -> None:
        raise AssertionError("no engine to hand a connection back to")  # (listener_for: None)

    def drained(self) -> bool:
        return True

    def begin_drain(self, until: float, take_backlog: bool) -> None:
        pass

    def forked(self) -> None:
        pass

    def shutdown(self) -> None:
        pass
