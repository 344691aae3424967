"""One HTTP/2 stream on the WSGI loop: the app call, its start_response, write() and wsgi.input.

The connection (:class:`refork.serving.wsgi.http2.Session`) feeds it (body pieces, end of body,
reset) on the loop thread; :meth:`Stream.run` is the app call, on an app thread (or the loop's,
with one thread), and talks to the connection's :class:`Http2Connection` under the session's lock.
Backpressure is HTTP/2's own: the body's window reopens as the app reads ``wsgi.input``, and a
write waits while the client's window for the stream is shut or the socket's queue is full.
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
    from refork.serving.wsgi.http2 import Session

log = logging.getLogger("refork")

__all__ = ["HIGH_WATER", "Stream"]

HIGH_WATER = 1 << 18  # socket bytes queued before apps' writes wait and reading pauses
_ERROR_BODY = b"Internal Server Error"


class Stream:
    """One request and its app call: the app side of a stream (``run`` on the app's thread)."""

    __slots__ = (
        "session", "sid", "request", "pieces", "body_done", "gone", "head_out", "status", "headers",
        "body_bytes", "opened_at", "received", "started", "token", "body_begun",
    )  # fmt: skip

    def __init__(self, session: Session, sid: int, request: Request, body_done: bool) -> None:
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
        self.body_begun = False  # the app produced body bytes (held back one item: see _call)
        self.token: object = None  # the worker's deadline of the app call

    def run(self) -> None:
        """The app call and its response; then the loop thread accounts for it."""
        session = self.session
        loop, conn, request = session.loop, session.conn, self.request
        control = loop.control
        token = self.token = control.request_started(request.method, request.path)
        began = time.perf_counter()
        environ: dict[str, Any] | None = None
        serving = deadlines.current.set(token)
        body = _StreamInput(self) if not self.body_done or self.pieces else EMPTY_INPUT
        try:
            environ = conn.builder.build(request, body, conn.client)
            environ["wsgi.early_hints"] = self.early_hints
            app = loop.app
            if loop.request_hooks is not None:
                app = loop.request_hooks.wrap_wsgi(app, request, environ)
            self._call(app, environ)
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
            if loop.access_log is not None and environ is not None:  # (post_request: inside --timeout)
                log_access(loop.access_log, request, environ.get("REMOTE_ADDR"), self.status, self.body_bytes,
                           time.perf_counter() - began, environ, self.headers)  # fmt: skip
            control.request_finished(token, self.status)
            with session.lock:
                session.finished.append(self)
            session.kick()

    def _call(self, app: Any, environ: dict[str, Any]) -> None:
        result = app(environ, self.start_response)
        try:
            held = b""  # one item behind: the last goes out with END_STREAM
            for item in result:
                if type(item) is not bytes:
                    raise TypeError(f"WSGI app yielded {type(item).__name__}, not bytes")
                if item:
                    self.body_begun = True  # (an early hint from now on comes too late)
                    if held:
                        self._send(held, end=False)
                    held = item
            self._send(held, end=True)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()

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

    def _send(self, data: bytes, end: bool) -> None:
        """The head if not out yet, then `data` as the client's window allows (END_STREAM with
        the last byte if `end`); the app waits while the window or the socket's queue is full."""
        if not self.started:
            raise AssertionError("the WSGI app did not call start_response()")
        session = self.session
        h2, write_timeout = session.h2, session.loop.timeouts.write
        if self.request.method == "HEAD":
            data = b""
        with session.lock:
            if self.gone:
                raise SendFailed("the client reset the stream")
            if not self.head_out:
                self.head_out = True
                h2.respond(self.sid, self.status, self.headers, end and not data)
                if end and not data:
                    session.kick()
                    return
            view = memoryview(data)
            self.body_bytes += len(data)
            while True:
                view = view[h2.send_body(self.sid, view, end):]
                session.kick()
                if not view:
                    break
                if not self.wait(lambda: self.gone or h2.window(self.sid) > 0, write_timeout):
                    log_write_timeout(write_timeout, session.conn.client, self.request)
                    h2.reset(self.sid, ErrorCodes.CANCEL)
                    self.gone = True
                    session.kick()
                if self.gone:
                    raise SendFailed("the client reset the stream")
            if session.backlog() > HIGH_WATER:  # the client does not read the connection fast enough
                self.wait(lambda: self.gone or session.closed or session.backlog() <= HIGH_WATER,
                          write_timeout)  # fmt: skip  (the loop's sweep cuts a stalled socket)

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
