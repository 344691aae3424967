"""The Python loop's hand-over to its app threads (``--threads`` > 1) and back.

A complete request goes to the next free app thread (held while a safe point is wanted: the
worker may fork there, with no thread of the pool); the thread answers it with the request
path's own call (`respond`, given here), queues the connection back and wakes the loop thread
through a socketpair. An HTTP/2 connection's app threads wake it the same way when its session
has bytes to send or a call ended (:meth:`AppHandoff.kick`). What the loop thread does with them
is the request path's (:class:`refork.serving.wsgi.request_path.RequestPath`).
"""

from __future__ import annotations

import logging
import queue
import socket
from collections.abc import Callable, Sequence

from refork.http.body import InputStream
from refork.http.events import Request
from refork.serving.wsgi.app_threads import AppThreads
from refork.serving.wsgi.conn import Conn, Job, Step
from refork.serving.wsgi.http2 import Session
from refork.serving.wsgi.http2_stream import Stream

log = logging.getLogger("refork")

# an app thread's answer to a request: True to keep the connection, False to close it
Respond = Callable[[Conn, Request, InputStream, Sequence[Step]], "bool | None"]


class AppHandoff:
    """The app threads, what they hand back, and the wake-up socket of the loop thread."""

    def __init__(self, threads: int, respond: Respond,
                 app_threads: Callable[[int, Callable[..., None]], AppThreads]) -> None:  # fmt: skip
        self.respond = respond
        self.pool = app_threads(threads, self._job)
        self.done: queue.SimpleQueue[tuple[Conn, bool, Sequence[Step]]] = queue.SimpleQueue()
        self.kicked: queue.SimpleQueue[Session] = queue.SimpleQueue()  # HTTP/2 sessions with news
        self.parked: list[Job] = []  # requests held for a safe point
        self.parked_streams: list[Stream] = []  # HTTP/2 streams held likewise
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)

    def wake(self) -> None:
        """(Any thread) the loop thread has news to read."""
        try:
            self.wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # a wake-up byte is already pending

    def kick(self, session: Session) -> None:
        """From an app thread: an HTTP/2 connection has bytes to send, or a call ended."""
        self.kicked.put(session)
        self.wake()

    def woken(self) -> None:
        """(The loop thread) the wake-up bytes read: the queues say what happened."""
        try:
            while self.wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def park(self, job: Job) -> None:
        """A request held until the safe point that is wanted (the worker may fork there)."""
        self.parked.append(job)

    def park_stream(self, stream: Stream) -> None:
        """An HTTP/2 stream's app call held likewise."""
        self.parked_streams.append(stream)

    def unpark(self) -> tuple[list[Job], list[Stream]]:
        """The requests and streams held for a safe point, for the app threads now."""
        parked, self.parked = self.parked, []
        streams, self.parked_streams = self.parked_streams, []
        return parked, streams

    def close(self) -> None:
        self.wake_r.close()
        self.wake_w.close()

    def _job(self, conn: Conn | Stream, request: Request | None, stream: InputStream,
             rest: Sequence[Step]) -> None:  # fmt: skip
        if request is None:  # an HTTP/2 stream's app call (refork.serving.wsgi.http2): it accounts itself
            assert isinstance(conn, Stream)
            conn.run()
            return
        assert isinstance(conn, Conn)
        keep: bool | None = False
        try:
            keep = self.respond(conn, request, stream, rest)  # a blocking Outbox: never None
        except Exception:
            log.exception("Error serving a request")
        finally:
            self.done.put((conn, bool(keep), rest))
            try:
                self.wake_w.send(b"\0")  # (wake(), inline: once per request)
            except (BlockingIOError, OSError):
                pass  # a wake-up byte is already pending
