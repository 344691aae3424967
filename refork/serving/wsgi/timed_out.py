"""The last act of a worker aborted past ``--timeout`` whose requests run on app threads
(``--threads`` > 1): no exception reaches them (only the loop's thread runs signal handlers), so
the loop's thread answers each one whose response has not started with a 500, as gunicorn's sync
worker answers its own, right before the worker exits; one whose response started is cut by the
exit. The one-thread loops need none of this: the request is interrupted on its own thread
(refork.deadlines.TimedOut)."""

from __future__ import annotations

import socket

from refork.http.response import simple_response
from refork.serving.outbox import Outbox

RESPONSE = simple_response(500, keep_alive=False)


def started(out: Outbox | None) -> bool:
    """Some of the response of the request `out` serves may have gone out (or is framed)."""
    ex = out.exchange if out is not None else None
    return ex is not None and bool(ex.sent or ex.head_sent)


def answer(out: Outbox) -> None:
    """The 500 on the Python loop's connection (TLS too), as far as the socket takes it now: never
    waited for, the worker exits next (an interim response's way of writing)."""
    try:
        out.hint(RESPONSE)
    except OSError:
        pass  # the client is gone


def answer_fd(fd: int) -> None:
    """The 500 on a native engine's socket, as far as it takes it now, then its end (FIN)."""
    sock = socket.socket(fileno=fd)
    try:
        sock.send(RESPONSE, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the client is gone, or takes nothing: the exit closes it all the same
    finally:
        sock.detach()
