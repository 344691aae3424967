"""HTTP/2 on the WSGI loop: one :class:`Session` per connection, each stream one app call.

The loop (:mod:`refork.serving.wsgi.python_loop`) turns a connection into a Session when TLS's
ALPN picked ``h2``, or when a cleartext connection opens with the preface and ``h2c`` is in
``--http-protocols`` (an engine hands such a connection to the loop). The protocol rules, limits
and attack budgets are the sans-IO :mod:`refork.http.h2`'s; the answers refork gives itself
(a limit's 4xx, --health-path) are :mod:`refork.serving.http2`'s, as on the ASGI loop.

Threads: the loop thread alone reads and writes the socket. With ``--threads`` > 1 each stream is
a job for the worker's app threads (at most that many in the app; the others wait in the queue,
holding no thread); the app's thread and the loop share the connection's state under one lock
and the app thread wakes the loop when it has bytes to send. With one thread the app runs on the
loop thread, one stream at a time, and a wait (the body, the client's window) turns the
connection's own reads and writes until it is over, as an HTTP/1.1 request blocks that worker.

Backpressure is HTTP/2's: a stream's receive window reopens only as its app reads
``wsgi.input``; the app's write waits while the client's window for the stream is shut (the
write timeout then resets that stream only) or while the socket's queue is over its high-water
mark (reading pauses meanwhile).
"""

from __future__ import annotations

import logging
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from refork.http.h2 import (
    ConnectionEnded,
    ErrorCodes,
    Http2Connection,
    Http2Event,
    StreamBody,
    StreamEnded,
    StreamOpened,
    StreamReset,
)
from refork.serving.connection import Expiry, Phase, log_write_timeout, peer_text
from refork.serving.http2 import LINGER, answer_here, charge_held, end_if_body_overdue, sniff_preface
from refork.serving.poller import IN, OUT
from refork.serving.wsgi.http2_stream import HIGH_WATER, Stream

if TYPE_CHECKING:
    from refork.serving.wsgi.conn import Conn
    from refork.serving.wsgi.roles import SessionLoop

log = logging.getLogger("refork")

__all__ = ["Session", "sniff", "take_over"]

_CHUNK = 1 << 16  # bytes per send() (TLS: a retry after a want repeats exactly this slice)
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class Session:
    """One HTTP/2 connection of the WSGI loop: the sans-IO connection, its socket queue, its streams."""

    def __init__(self, loop: SessionLoop[Session, Stream], conn: Conn) -> None:
        self.loop = loop
        self.conn = conn
        self.h2 = Http2Connection(loop.h2_limits, time.monotonic, loop.control.http2_count)
        self.threaded = loop.pool is not None
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)  # body bytes, a window, room in the queue, a reset
        self.streams: dict[int, Stream] = {}
        self.ready: deque[Stream] = deque()  # one thread: the streams the loop thread runs next
        self.finished: list[Stream] = []  # app calls over, for the loop thread to account
        self.queued: set[Stream] = set()  # streams with body bytes their client's window has not taken
        self.paused: set[Stream] = set()  # app calls paused until their client takes the queue
        self.running = False  # one thread: an app call is on the loop thread now
        self.unflushed = 0  # one thread: response bytes written since the last flush
        self.out = bytearray()  # bytes for the socket
        self.sending = b""  # the slice a send() is writing (a TLS retry repeats it)
        self.polled = IN
        self.closed = False
        self.goaway_sent = False
        self.since = time.monotonic()  # when the connection last had no stream (keep-alive clock)
        self.fresh = True  # no request yet (the header deadline)
        self.stalled_since = 0.0  # the socket took no bytes since (the write timeout)
        self.lingering_since = 0.0  # the write side is shut: what the client still sends is dropped
        self.linger_due = False  # a lingering close waits for what is queued to go out
        self.released = 0  # body bytes apps took, for the loop thread to give back to the budget
        self.held = 0  # bytes h2 holds (a header block arriving), charged to --max-request-memory

    # ------------------------------------------------------------ the loop thread

    def start(self, data: bytes) -> None:
        self.loop.control.http2_count("connections", 1)  # (lost() takes it back)
        with self.lock:
            self.h2.start()
        self.feed(data)

    def on_ready(self) -> None:
        """The socket is readable or writable: write what waits, then read (unless the client
        does not read its answers)."""
        self.flush()
        if self.closed or len(self.out) > HIGH_WATER:
            return
        data = self._recv()
        if data is None:
            return
        if not data:
            self.loop._close(self.conn)  # the client closed: its streams are gone
            return
        if self.lingering_since:
            return  # (dropped)
        self.feed(data)

    def linger(self) -> None:
        """A lingering close: what is queued (a GOAWAY, the last responses) goes out, the write
        side shuts, and the client's last bytes are read and dropped until it closes (or LINGER
        passes): closing with unread bytes would reset the connection, and the client could lose
        the answers it has not read yet."""
        if self.lingering_since or self.closed:
            return
        self.flush()
        if self.closed:
            return
        if self.sending or self.out:
            # what is queued goes first (closing now would reset the connection and lose it): the
            # flush that sends the rest lingers then; a client that takes nothing meets the write
            # timeout
            self.linger_due = True
            return
        self.lingering_since = time.monotonic()
        if self.conn.tls is not None:
            self.conn.tls.close_notify()  # (TLS's goodbye first; what follows is read from the plain socket)
        try:
            socket.socket.shutdown(self.conn.sock, socket.SHUT_WR)
        except OSError:
            self.loop._close(self.conn)

    def _recv(self) -> bytes | None:
        conn = self.conn
        try:
            if conn.tls is not None and not self.lingering_since:
                data = conn.tls.read(self.loop.read_size)
            else:  # (lingering over TLS: the plain socket's bytes, dropped)
                data = socket.socket.recv(conn.sock, self.loop.read_size)
        except _WOULD_BLOCK:
            return None
        except OSError:
            return b""
        return data

    def feed(self, data: bytes) -> None:
        """Bytes from the client: the events they make, handled; what they make the server say, sent."""
        if data:
            with self.lock:
                for event in self.h2.receive(data):
                    self._handle(event)
                self._hold(len(data))
                self.changed.notify_all()
        self.service()

    def _hold(self, received: int) -> None:
        """What h2 holds of the client's bytes, charged to the worker's budget (charge_held)."""
        if self.h2.ended:
            self.loop.memory.note(received)  # (its bytes went through, if only to be refused)
            return  # (what it holds is given back by lost(), its buffers with it)
        self.held, ended = charge_held(self.h2, self.loop.memory, self.held)
        if ended is not None:
            self._handle(ended)

    def _handle(self, event: Http2Event) -> None:
        kind = type(event)
        if kind is StreamBody:
            assert isinstance(event, StreamBody)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.pieces.append(event.data)
                self.loop.memory.charge(len(event.data))  # held for the app: the worker's budget
                stream.received += len(event.data)
        elif kind is StreamOpened:
            assert isinstance(event, StreamOpened)
            self._open(event)
        elif kind is StreamEnded:
            assert isinstance(event, StreamEnded)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.body_done = True
        elif kind is StreamReset:
            assert isinstance(event, StreamReset)
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream.gone = True
        elif kind is ConnectionEnded:
            assert isinstance(event, ConnectionEnded)
            if not event.by_client and event.code:  # an attack: warning; a broken client: debug
                level = logging.WARNING if event.code == ErrorCodes.ENHANCE_YOUR_CALM else logging.DEBUG
                peer = peer_text(self.conn.client)
                log.log(level, "HTTP/2 connection from %s ended: %s", peer, event.reason)
            for stream in self.streams.values():
                if not (event.by_client and stream.sid <= event.last_stream_id):
                    stream.gone = True  # (a graceful GOAWAY from the client: its streams finish)

    def _open(self, event: StreamOpened) -> None:
        loop, request, sid = self.loop, event.request, event.stream_id
        self.fresh = False
        if event.refused:
            answer_here(self.h2, sid, event.refused)
            return
        kind = loop.health.check(request, event.ended) if loop.health is not None else None
        if kind is not None:  # --health-path: answered here, never by the app; not counted, not logged
            answer_here(self.h2, sid, loop.control.health(kind), request.method == "HEAD", health=True)
            return
        stream = Stream(self, sid, request, event.ended)
        self.streams[sid] = stream
        if self.threaded:
            loop.h2_dispatch(stream)
        else:
            self.ready.append(stream)

    def service(self) -> None:
        """Account the app calls that ended, send what is queued, run the next streams (one
        thread); close once the connection is over."""
        self._account()
        self.flush()
        if not self.threaded and not self.running:
            while not self.closed and (stream := self._runnable()) is not None:
                if stream.items is None:  # (a paused call resumed is in flight already)
                    self.loop.in_flight += 1
                self.running = True
                try:
                    stream.run()
                finally:
                    self.running = False
                self._account()
            self.flush()  # (the streams run in this turn share one send())
        if not self.closed and not self.streams and not self.queued and (self.h2.going_away or self.h2.ended):
            self.linger()  # (after the final GOAWAY: streams on the wire until then are served)

    def _drop_body(self, stream: Stream) -> None:
        """The body bytes a stream held (taken by its app, or left unread) leave the worker's
        --max-request-memory (on the loop thread: the budget is the loop's)."""
        self.released += sum(len(piece) for piece in stream.pieces)
        stream.pieces.clear()
        if self.released:
            self.loop.memory.give_back(self.released)
            self.released = 0

    def _runnable(self) -> Stream | None:
        """One thread: the next stream to run on the loop thread. One whose body is all here (or
        fills its window: the client sends no more until the app reads); a stream whose body is
        still coming waits without the thread, as over HTTP/1.1, and one whose body never comes
        gets its 408 from the sweep and is dropped here."""
        window = self.h2.limits.initial_window_size
        dropped = False
        with self.lock:
            for stream in list(self.ready):
                if stream.gone and stream.items is None:  # (never started: dropped; a paused call ends)
                    self.ready.remove(stream)
                    self.streams.pop(stream.sid, None)
                    self._drop_body(stream)
                    dropped = True
                elif stream.body_done or stream.received >= window or stream.items is not None:
                    self.ready.remove(stream)
                    return stream
        if dropped and not self.streams and not self.ready:
            self.since = time.monotonic()  # (the idle clock runs from the last stream's end)
        return None

    def _account(self) -> None:
        loop = self.loop
        with self.lock:
            finished, self.finished = self.finished, []
            for stream in finished:
                self.streams.pop(stream.sid, None)
                self._drop_body(stream)
                loop.in_flight -= 1
                if not stream.body_done and not stream.gone and not self.closed:
                    stream.body_unwanted = True  # answered before its body came: the rest is not wanted
                    if not stream.queued:  # (else once the response is out: _send_queued)
                        self.h2.reset(stream.sid, 0)
            if self.released:  # (what the apps read meanwhile)
                loop.memory.give_back(self.released)
                self.released = 0
            if finished and not self.streams:
                self.since = time.monotonic()
        if finished:
            loop.control.http2_count("requests", len(finished))

    def flush(self) -> None:
        """Write what is queued, as much as the socket takes now; poll for the rest."""
        if self.closed:
            return
        self.unflushed = 0
        with self.lock:
            if self.queued:
                self._send_queued()
            data = self.h2.data_to_send()
            if data:
                self.out += data
            sock = self.conn.sock
            progress = False
            while self.sending or self.out:
                if not self.sending:
                    self.sending = bytes(self.out[:_CHUNK])
                    del self.out[:_CHUNK]
                try:
                    n = sock.send(self.sending)
                except _WOULD_BLOCK:
                    break
                except OSError:
                    self.loop._close(self.conn)
                    return
                self.sending = self.sending[n:]
                progress = True
            waiting = bool(self.sending or self.out)
            if progress or not waiting:
                self.stalled_since = time.monotonic() if waiting else 0.0
                self.changed.notify_all()
            elif not self.stalled_since:
                self.stalled_since = time.monotonic()
            if self.paused:
                self._resume_paused()
        mask = (OUT if len(self.out) > HIGH_WATER else IN | OUT) if waiting else IN
        if mask != self.polled and self.conn.registered:
            self.polled = mask
            self.loop.poller.watch(self.conn.fd, mask)
        if self.linger_due and not waiting:
            self.linger_due = False
            self.linger()

    def _send_queued(self) -> None:
        """(With the lock.) The streams' queued bytes, as far as their windows open now."""
        for stream in list(self.queued):
            if stream.gone:
                stream.queued.clear()
                stream.queued_bytes = 0
            else:
                stream.send_queued()
            if not stream.queued:
                self.queued.discard(stream)
                stream.stalled_since = 0.0
                if stream.body_unwanted and not (stream.body_done or stream.gone):
                    self.h2.reset(stream.sid, 0)

    def pause(self, stream: Stream) -> None:
        """(With the lock.) A call whose client has not taken enough of its body lets go of its
        thread; _resume_paused gives it one back once the queue is short (or the stream gone)."""
        stream.paused = True
        self.paused.add(stream)
        self.loop.control.request_waiting(stream.token)  # (its client's time, not the app's)
        self.kick()  # (the window may have opened meanwhile)

    def _resume_paused(self) -> None:
        """(The loop thread, with the lock.)"""
        for stream in list(self.paused):
            if stream.gone or stream.taken():
                self._resume(stream)

    def _resume(self, stream: Stream) -> None:
        self.paused.discard(stream)
        stream.paused = False
        self.loop.control.request_resumed(stream.token)
        if self.threaded:
            assert self.loop.pool is not None
            self.loop.pool.submit((stream, None, None, None))  # (AppHandoff._job: stream.run() goes on)
        else:
            self.ready.append(stream)

    def lost(self) -> None:
        """The loop closed the connection: every stream is gone; the apps still running end."""
        with self.lock:
            if not self.closed:
                self.loop.control.http2_count("connections", -1)
            self.closed = True
            if self.held:
                self.loop.memory.give_back(self.held)
                self.held = 0
            self.h2.release()  # (freed now, with what it buffered, not at the next full collection)
            resumed = [stream for stream in self.ready if stream.items is not None]
            for stream in self.ready:  # (never run: the others' bodies go when their calls end)
                if stream.items is None:
                    self.streams.pop(stream.sid, None)
                    self._drop_body(stream)
            self.ready.clear()
            for stream in self.streams.values():
                stream.gone = True
            self.queued.clear()
            for stream in list(self.paused):
                self._resume(stream)  # (to end: its next send finds the stream gone)
            self.changed.notify_all()
        if not self.threaded:  # (no loop turn comes for this connection again: end the calls here)
            for stream in [*resumed, *self.ready]:
                stream.run()
            self.ready.clear()
            self._account()

    def stop(self) -> None:
        """Graceful: the two-step GOAWAY (Http2Connection.goaway); the streams taken until the final
        one finish, then the connection closes."""
        if self.closed or self.goaway_sent:
            return
        with self.lock:
            self.goaway_sent = True
            self.h2.goaway()
        self.service()

    def sweep(self, now: float, draining: bool, drain_until: float) -> None:
        """The deadlines (once a second): a socket that takes nothing, stalled bodies, the idle clock."""
        loop, timeouts = self.loop, self.loop.timeouts
        if self.lingering_since:
            if now - self.lingering_since >= LINGER:
                loop._close(self.conn)
            return
        if self.stalled_since and timeouts.write_stalled(self.stalled_since, now):
            log_write_timeout(timeouts.write, self.conn.client, None)
            loop._close(self.conn)
            return
        if draining and not self.goaway_sent:
            self.stop()
            return
        with self.lock:
            self.h2.tick()  # (the final GOAWAY, if the PING's ACK is overdue)
            self._sweep_streams(now)
            idle = not self.streams and not self.ready and not self.queued
        if idle and not self.goaway_sent:
            phase = Phase.HEAD if self.fresh else Phase.IDLE
            if timeouts.expiry(phase, self.since, now, drain_until, 0, False) is not Expiry.NONE:
                self.stop()
                return
        self.service()

    def _sweep_streams(self, now: float) -> None:
        """Bodies that do not arrive in time: 408 on their stream (a reset once the response
        started); the stream pays, not the connection."""
        timeouts = self.loop.timeouts
        for stream in self.streams.values():
            if not (stream.gone or stream.body_done) and end_if_body_overdue(self.h2, stream, now, timeouts):
                stream.gone = True
        for stream in list(self.queued):  # a window that stays shut: that stream is reset, no other
            if not stream.gone and timeouts.write_stalled(stream.stalled_since, now):
                log_write_timeout(timeouts.write, self.conn.client, stream.request, "stream reset")
                self.h2.reset(stream.sid, ErrorCodes.CANCEL)
                stream.gone = True
        self.changed.notify_all()

    # ------------------------------------------------------------ an app's thread (with the lock)

    def wait(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Until `ready()` or `timeout` seconds: on an app thread, for the loop to change the
        state; on the loop thread (one thread), turning this connection's reads and writes."""
        if self.threaded:
            return self.changed.wait_for(ready, timeout)
        deadline = time.monotonic() + timeout
        fd = self.conn.fd
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return ready()
            self.flush()
            if self.closed:
                continue
            poll = select.poll()
            poll.register(fd, (IN | OUT) if (self.sending or self.out) else IN)
            if poll.poll(min(left, 1.0) * 1000):
                self.on_ready()
            self.h2.tick()  # (the loop's sweep waits for this app call)
            self._sweep_streams(time.monotonic())
        return True

    def answer_timed_out(self) -> None:
        """The worker is aborted past --timeout (refork.serving.wsgi.timed_out): each stream in an
        app call gets a 500 if its response has not started (else a reset), written now."""
        if self.closed or not self.lock.acquire(timeout=0.5):  # (an app thread may hold it)
            return
        try:
            for stream in list(self.streams.values()):
                if stream.token is not None:
                    stream._abort()
            self.flush()
        finally:
            self.lock.release()

    def kick(self) -> None:
        """Bytes for the socket (or an app call over): the loop thread sends them."""
        if self.threaded:
            self.loop.h2_kick(self)
        else:
            self.flush()

    def written(self, n: int) -> None:
        """A stream's response bytes (or its end) for the socket. On the loop thread they wait for
        the end of service()'s turn, so the streams answered in one turn share one send() (a
        send each cost a third of a request), unless HIGH_WATER bytes wait."""
        if self.running and not self.threaded and self.unflushed + n <= HIGH_WATER:
            self.unflushed += n
        else:
            self.kick()

    def backlog(self) -> int:
        return len(self.out) + len(self.sending)


def take_over(loop: SessionLoop[Session, Stream], conn: Conn, data: bytes) -> None:
    """The connection speaks HTTP/2 from here (ALPN picked h2, or it opened with the preface on an
    h2c port); ``data`` is what was read of it so far."""
    conn.sniffed = None
    conn.fresh = False
    session = conn.h2 = Session(loop, conn)
    session.start(data)


def sniff(loop: SessionLoop[Session, Stream], conn: Conn, data: bytes) -> bytes:
    """h2c: a cleartext connection that opens with the HTTP/2 preface is served HTTP/2. The bytes
    for HTTP/1.1; b"" while they may still be the preface, once handed over, or when closed
    (without h1 in --http-protocols anything else is closed)."""
    seen = (conn.sniffed or b"") + data
    verdict = sniff_preface(seen)
    if verdict is None:
        conn.sniffed = seen
        return b""
    conn.sniffed = None
    if verdict:
        take_over(loop, conn, seen)
        return b""
    if not loop.h1:
        loop._close(conn)
        return b""
    return seen
