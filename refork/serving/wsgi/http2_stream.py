"""One HTTP/2 stream on the WSGI loop: the app call, its start_response, write() and wsgi.input.

The connection (:class:`refork.serving.wsgi.http2.Session`) feeds it (body pieces, end of body,
reset) on the loop thread; :meth:`Stream.run` is the app call, on an app thread (or the loop's,
with one thread), and talks to the connection's :class:`Http2Connection` under the session's lock.
Backpressure is HTTP/2's own: the body's window reopens as the app reads ``wsgi.input``; what the
client's window does not take yet is queued on the stream, and once the queue passes
:data:`STREAM_BUDGET` (or the socket's queue passes :data:`HIGH_WATER`) the app call is paused
between two items of its body: no thread waits for a client that does not read. The loop moves
the queue on as windows open and resumes the call (on an app thread, or its own) once it is short;
the sweep resets a stream whose client took nothing for ``--write-timeout``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from refork import deadlines
from refork.http.body import EMPTY_INPUT, InputStream
from refork.http.events import Request
from refork.http.h2 import ErrorCodes
from refork.serving.connection import log_access, log_write_timeout
from refork.wsgi.response import SendFailed, check_header, check_status, hint_fields

if TYPE_CHECKING:
    from refork.serving.wsgi.roles import StreamSession

log = logging.getLogger("refork")

__all__ = ["HIGH_WATER", "STREAM_BUDGET", "Stream"]

HIGH_WATER = 1 << 18  # socket bytes queued before apps' writes wait and reading pauses
STREAM_BUDGET = 1 << 16  # body bytes queued on a stream (its window shut) before its app call pauses
_ERROR_BODY = b"Internal Server Error"


class Stream:
    """One request and its app call: the app side of a stream (``run`` on the app's thread)."""

    __slots__ = (
        "session", "sid", "request", "pieces", "body_done", "gone", "head_out", "status", "headers",
        "body_bytes", "opened_at", "received", "started", "token", "body_begun", "began", "environ",
        "result", "items", "held", "queued", "queued_bytes", "queued_end", "stalled_since", "paused",
        "body_unwanted",
    )  # fmt: skip

    def __init__(self, session: StreamSession[Stream], sid: int, request: Request, body_done: bool) -> None:
        self.session = session
        self.sid = sid
        self.request = request
        self.pieces: deque[bytes] = deque()  # body bytes not read by the app yet
        self.body_done = body_done
        self.gone = False  # reset by the client (or refork), or the connection lost
        self.head_out = False
        self.status = 0  # from start_response
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_bytes = 0
        self.opened_at = time.monotonic()  # the body deadline runs from the head
        self.received = 0  # body bytes (each --body-min-rate of them extends the deadline)
        self.started = False  # start_response was called
        self.body_begun = False  # the app produced body bytes (held back one item: see _pump)
        self.token: object = None  # the worker's deadline of the app call
        self.began = 0.0
        self.environ: dict[str, Any] | None = None
        self.result: Any = None  # what the app returned (closed at the end)
        self.items: Iterator[Any] | None = None  # its iterator: None until the app returned
        self.held = b""  # one body item behind: the last goes out with END_STREAM
        self.queued: deque[memoryview] = deque()  # body bytes the client's window has not taken
        self.queued_bytes = 0
        self.queued_end = False  # END_STREAM goes with the last queued byte
        self.stalled_since = 0.0  # the client's window took nothing of the queue since (0: empty)
        self.paused = False  # the call waits, without a thread, for the client to take the queue
        self.body_unwanted = False  # answered before the request's body came: reset once sent

    def run(self) -> None:
        """The app call, or its continuation once the client took what was queued; when it ends,
        the loop thread accounts for it."""
        session = self.session
        loop, request = session.loop, self.request
        control = loop.control
        if self.token is None:
            self.token = control.request_started(request.method, request.path)
            self.began = time.perf_counter()
        serving = deadlines.current.set(self.token)
        ended = True
        try:
            if self.items is None:
                body = _StreamInput(self) if not self.body_done or self.pieces else EMPTY_INPUT
                environ = self.environ = session.conn.builder.build(request, body, session.conn.client)
                environ["wsgi.early_hints"] = self.early_hints
                app = loop.app
                if loop.request_hooks is not None:
                    app = loop.request_hooks.wrap_wsgi(app, request, environ)
                self.result = app(environ, self.start_response)
                self.items = iter(self.result)
            ended = self.gone or self._pump()  # (a stream gone while paused: its call just ends)
        except SendFailed as e:
            log.debug("HTTP/2 stream %d ended early: %s", self.sid, e)
        except Exception:
            if self.gone:
                log.debug("WSGI app failed after its stream was reset", exc_info=True)
            else:
                log.exception("Error handling request %s", request.path.decode("latin-1"))
            self._abort()
        finally:
            deadlines.current.reset(serving)
            if ended:
                self._end()

    def _pump(self) -> bool:
        """Body items to the stream until the iterable ends (True), or until the client has not
        taken enough of them (False: the call pauses here, holding no thread)."""
        assert self.items is not None
        session = self.session
        for item in self.items:
            if type(item) is not bytes:
                raise TypeError(f"WSGI app yielded {type(item).__name__}, not bytes")
            if item:
                self.body_begun = True  # (an early hint from now on comes too late)
                if self.held:
                    self._send(self.held, end=False)
                self.held = item
                with session.lock:
                    if self.gone:
                        raise SendFailed("the client reset the stream")
                    if not self.taken():
                        session.pause(self)
                        return False
        held, self.held = self.held, b""
        self._send(held, end=True)
        return True

    def _end(self) -> None:
        """The call is over (done, failed, or its stream gone): close the iterable, account."""
        session, loop = self.session, self.session.loop
        result, self.result, self.items = self.result, None, None
        close = getattr(result, "close", None)
        if close is not None:
            try:
                close()
            except Exception:
                log.exception("Error closing the response of %s", self.request.path.decode("latin-1"))
        if loop.access_log is not None and self.environ is not None:  # (post_request: inside --timeout)
            took = time.perf_counter() - self.began
            log_access(loop.access_log, self.request, self.environ.get("REMOTE_ADDR"), self.status,
                       self.body_bytes, took, self.environ, self.headers)  # fmt: skip
        loop.control.request_finished(self.token, self.status)
        with session.lock:
            session.finished.append(self)
        session.written(0)

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
                       ) -> Callable[[bytes], None]:  # fmt: skip
        """PEP 3333's, with the HTTP/1.1 path's checks (refork.wsgi.response)."""
        if exc_info is not None:
            try:
                if self.head_out:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.started:
            raise AssertionError("start_response() called a second time without exc_info")
        code, _ = check_status(status)
        if type(headers) is not list:
            raise TypeError(f"WSGI headers must be a list, got {type(headers).__name__}")
        self.headers = [check_header(item)[0] for item in headers]
        self.status, self.started = code, True
        return self.write

    def early_hints(self, headers: Any) -> None:
        """``wsgi.early_hints`` (gunicorn's API): a 103 as an informational HEADERS frame before the
        response's; ignored once the response head is out. Queued, never waited for."""
        if self.head_out or self.body_begun:
            return
        fields = hint_fields(headers)
        session = self.session
        with session.lock:
            if not self.gone and not self.head_out:
                session.h2.informational(self.sid, 103, fields)
                session.kick()

    def write(self, data: bytes) -> None:
        """The legacy write() callable: sent before it returns (as the client's window allows)."""
        if type(data) is not bytes:
            raise TypeError(f"write() takes bytes, got {type(data).__name__}")
        if data:
            self._send(data, end=False)
            session, write_timeout = self.session, self.session.loop.timeouts.write
            with session.lock:  # (a call inside the app cannot pause: it waits, bounded)
                if not self.wait(lambda: self.gone or session.closed or self.taken(), write_timeout):
                    log_write_timeout(write_timeout, session.conn.client, self.request, "stream reset")
                    session.h2.reset(self.sid, ErrorCodes.CANCEL)
                    self.gone = True
                if self.gone:
                    raise SendFailed("the client reset the stream")

    def _send(self, data: bytes, end: bool) -> None:
        """The head if not out yet, then `data` as the client's window allows (END_STREAM with
        the last byte if `end`); what the window does not take is queued for the loop to send."""
        if not self.started:
            raise AssertionError("the WSGI app did not call start_response()")
        session = self.session
        h2 = session.h2
        if self.request.method == "HEAD":
            data = b""
        with session.lock:
            if self.gone:
                raise SendFailed("the client reset the stream")
            if not self.head_out:
                self.head_out = True
                h2.respond(self.sid, self.status, self.headers, end and not data)
                if end and not data:
                    session.written(0)
                    return
            view = memoryview(data)
            self.body_bytes += len(data)
            if not self.queued:
                view = view[h2.send_body(self.sid, view, end):]
            if view or (end and self.queued):
                if not self.queued:
                    self.stalled_since = time.monotonic()
                self.queued.append(view)
                self.queued_bytes += len(view)
                self.queued_end = end
                session.queued.add(self)
        session.written(len(data))

    def taken(self) -> bool:
        """The client took enough of what was queued for more to be sent."""
        return self.queued_bytes <= STREAM_BUDGET and self.session.backlog() <= HIGH_WATER

    def send_queued(self) -> None:
        """(The loop thread, with the lock.) What the client's window takes now of the queue."""
        h2, queued = self.session.h2, self.queued
        while queued:
            view = queued[0]
            n = h2.send_body(self.sid, view, self.queued_end and len(queued) == 1)
            if n:
                self.queued_bytes -= n
                self.stalled_since = time.monotonic()
            if n < len(view):
                queued[0] = view[n:]
                return
            queued.popleft()

    def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait for the client (the body, its window, the socket), with the session's lock: its
        time, not the app's (the worker's --timeout does not count it)."""
        control = self.session.loop.control
        control.request_waiting(self.token)
        try:
            return self.session.wait(ready, timeout)
        finally:
            control.request_resumed(self.token)

    def _abort(self) -> None:
        """500 if nothing went out yet, else RST_STREAM INTERNAL_ERROR (the client sees it cut)."""
        session = self.session
        with session.lock:
            if self.gone:
                return
            if not self.head_out:
                self.head_out = True
                self.status = 500
                self.headers = [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", b"%d" % len(_ERROR_BODY))]  # fmt: skip
                session.h2.respond(self.sid, 500, self.headers, False)
                self.body_bytes = len(_ERROR_BODY)
                session.h2.send_body(self.sid, memoryview(_ERROR_BODY), True)
            else:
                session.h2.reset(self.sid, ErrorCodes.INTERNAL_ERROR)
        session.kick()


class _StreamInput(InputStream):
    """``wsgi.input`` of a stream: its body as it arrives; what the app reads reopens the
    client's window by as much."""

    __slots__ = ("stream", "buf")

    def __init__(self, stream: Stream) -> None:
        super().__init__(None, stream.request.content_length or 0)  # type: ignore[arg-type]
        self.stream = stream
        self.buf = b""

    def _more(self) -> bool:
        """Wait for more of the body; False at its end (or when the stream is gone)."""
        stream = self.stream
        session = stream.session
        with session.lock:
            # Until the body comes, ends, or the stream is gone: the loop's sweep decides a body
            # that does not come (408, and gone), never a wait's timeout, or a stalled body would
            # read as a short one.
            while not (stream.pieces or stream.body_done or stream.gone or session.closed):
                stream.wait(lambda: bool(stream.pieces) or stream.body_done or stream.gone, 1.0)
            if not stream.pieces:
                return False
            data = b"".join(stream.pieces)
            stream.pieces.clear()
            session.released += len(data)  # (given back to the worker's budget by the loop thread)
            session.h2.body_consumed(stream.sid, len(data))
        session.kick()
        self.buf += data
        return True

    def read(self, size: int | None = -1) -> bytes:
        while (size is None or size < 0 or len(self.buf) < size) and self._more():
            pass
        if size is None or size < 0:
            data, self.buf = self.buf, b""
        else:
            data, self.buf = self.buf[:size], self.buf[size:]
        return data

    def readline(self, size: int | None = -1) -> bytes:
        while b"\n" not in self.buf and (size is None or size < 0 or len(self.buf) < size) and self._more():
            pass
        end = self.buf.find(b"\n") + 1 or len(self.buf)
        if size is not None and size >= 0:
            end = min(end, size)
        data, self.buf = self.buf[:end], self.buf[end:]
        return data

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        lines: list[bytes] = []
        total = 0
        while True:
            line = self.readline()
            if not line:
                return lines
            lines.append(line)
            total += len(line)
            if hint is not None and 0 < hint <= total:
                return lines

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def close(self) -> None:
        self.buf = b""
