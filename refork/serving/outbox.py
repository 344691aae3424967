"""What a WSGI connection still owes its client, written as the socket takes it.

The single-thread loop uses it *buffering*: a send takes what the socket takes now and keeps the
rest (a view of the app's bytes, never a copy), and the loop pulls the next body item only once
the kept bytes are out (:class:`refork.wsgi.Streaming`). So a client that never reads holds at
most one body item in memory and no thread at all, and the loop serves everyone else meanwhile.

A pool thread (``--threads`` > 1) uses it *blocking*: it waits for the socket, bounded by the
write timeout without progress. Either way, time spent waiting on the client is reported to the
worker (request_waiting / request_resumed), so it never counts against ``--timeout``.
"""

from __future__ import annotations

import errno
import os
import select
import socket
from collections import deque
from typing import Any

from refork.http.events import Request
from refork.serving.connection import log_write_timeout
from refork.serving.contract import WorkerControl

_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)  # EPIPE, not SIGPIPE, even if an app reset the handler
_FileSpan = tuple[int, int, int]  # fd, offset, bytes left


class Outbox:
    """A connection's output (a :class:`refork.wsgi.Output`): bytes and file spans not yet written."""

    __slots__ = (
        "sock", "fd", "client", "queue", "backlogged", "write_timeout", "buffering", "control", "token",
        "request", "wants", "exchange",
    )  # fmt: skip

    zero_copy = True

    def __init__(
        self, sock: socket.socket, client: object, write_timeout: float, control: WorkerControl,
        buffering: bool,
    ) -> None:  # fmt: skip
        self.sock = sock
        self.fd = sock.fileno()
        self.client = client
        self.queue: deque[memoryview | _FileSpan] = deque()
        self.backlogged = False  # the queue holds something: a plain attribute, read per response
        self.write_timeout = write_timeout
        self.buffering = buffering
        self.control = control
        self.token: object = None  # the request being answered: for request_waiting, the log
        self.request: Request | None = None
        self.exchange: Any = None  # the response being written (refork.wsgi.response._Exchange)
        self.wants = select.POLLOUT  # what a blocked write waits for (TLS: POLLIN when OpenSSL must read)

    def send(self, data: bytes) -> None:
        queue = self.queue
        if queue:
            queue.append(memoryview(data))
        else:
            try:
                n = self.sock.send(data, _NOSIGNAL)
            except BlockingIOError:
                n = 0
            if n == len(data):
                return
            queue.append(memoryview(data)[n:])
            self.backlogged = True
        if not self.buffering:
            self.flush()

    def hint(self, data: bytes) -> None:
        """An interim response (103 Early Hints): written if the socket takes it now, else dropped,
        never waited for (it is advisory); a part the socket took is finished before anything else."""
        if self.queue:
            return  # (something waits already: the hint would only wait behind it)
        try:
            n = self.sock.send(data, _NOSIGNAL)
        except BlockingIOError:
            return
        if n < len(data):
            self.queue.append(memoryview(data)[n:])
            self.backlogged = True

    def sendfile(self, fd: int, offset: int, count: int | None) -> int:
        if count is None:
            count = max(os.fstat(fd).st_size - offset, 0)
        if count:
            queue = self.queue
            queue.append((fd, offset, count))
            self.backlogged = True
            if not self.buffering:
                self.flush()
            elif len(queue) == 1:
                self.write_some()
        return count

    def write_some(self) -> bool:
        """Write what the socket takes now; True when nothing is left. OSError: the client is gone."""
        queue = self.queue
        sock = self.sock
        while queue:
            item = queue[0]
            if isinstance(item, tuple):
                fd, offset, left = item
                try:
                    n = os.sendfile(self.fd, fd, offset, min(left, 1 << 30))
                except BlockingIOError:
                    return False
                if n == 0:
                    raise OSError(errno.EIO, f"file_wrapper: file ended {left} bytes short")
                if n < left:
                    queue[0] = (fd, offset + n, left - n)
                    continue
            else:
                try:
                    n = sock.send(item, _NOSIGNAL)
                except BlockingIOError:
                    return False
                if n < len(item):
                    queue[0] = item[n:]
                    return False
            queue.popleft()
        self.backlogged = False
        return True

    def flush(self) -> None:
        """Block until everything is written; TimeoutError after write_timeout without progress."""
        if not self.queue:
            return
        control, token = self.control, self.token
        poll = select.poll()
        mask = select.POLLOUT
        poll.register(self.fd, mask)
        while not self.write_some():
            if self.wants != mask:  # TLS: a write that needs a read first, and back
                mask = self.wants
                poll.modify(self.fd, mask)
            control.request_waiting(token)  # the client's time, not the app's
            try:
                ready = poll.poll(self.write_timeout * 1000)
            finally:
                control.request_resumed(token)
            if not ready:
                self.clear()
                log_write_timeout(self.write_timeout, self.client, self.request)
                raise TimeoutError(f"write timeout: no progress for {self.write_timeout:.1f} s")

    def clear(self) -> None:
        self.queue.clear()
        self.backlogged = False

