"""A worker that retires loses no HTTP/2 stream already on the wire, on every path that speaks
HTTP/2: its first GOAWAY names every stream (2^31-1), and only its final one, a round trip later,
names the last stream it took (RFC 9113 6.8). Here the worker retires at --max-requests; a stop,
a reload and a refork end its connections the same way (docs/http2.md).
"""

from __future__ import annotations

import select
import signal
import time
from contextlib import closing

import h2.events
from conftest import Server
from hyperframe.frame import GoAwayFrame, SettingsFrame
from support.h2client import PREFACE, H2Client, connect, frames
from support.request_paths import flags, http2_paths, tls

ANY_STREAM = 2**31 - 1


class GoawayWatcher(H2Client):
    """An H2Client that keeps the last stream id of every GOAWAY it reads, in order."""

    goaways: list[int]

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            self.goaways.append(event.last_stream_id or 0)
        super()._handle(event)


def readable(client: H2Client, timeout: float) -> bool:
    sock = client.sock
    pending = getattr(sock, "pending", None)  # (TLS: bytes already decrypted wait in the SSL object)
    return bool(pending and pending()) or bool(select.select([sock], [], [], timeout)[0])


def serve(start_server, path: str, *args: str) -> Server:
    chosen, app = flags(path, "apps.promises")
    return start_server(*chosen, *args, app=app, workers=1)


@http2_paths
def test_a_retiring_worker_answers_every_stream_sent_before_its_goaway(start_server, path):
    """One connection opens a stream every millisecond (at most 50 unanswered) until it reads a
    GOAWAY, as a client must (RFC 9113 6.8), while the worker retires at its 50th request: every
    stream opened is answered, none refused, then the connection closes."""
    server = serve(start_server, path, "--max-requests", "50")
    with closing(GoawayWatcher(server.port, timeout=20, tls=tls(path))) as client:
        client.goaways = []
        opened: list[int] = []
        deadline = time.monotonic() + 20
        while not client.goaways:
            assert time.monotonic() < deadline, "no GOAWAY: the worker did not retire"
            if sum(not client.answers[sid][2] for sid in opened) < 50:
                opened.append(client.send("GET", "/"))
            if readable(client, 0.001):
                client.read()
        client.wait_closed()
    assert client.resets == {}  # (a stream refused: RST_STREAM REFUSED_STREAM)
    unanswered = [sid for sid in opened if not client.answers[sid][2]]
    assert unanswered == []
    assert {client.answers[sid][0] for sid in opened} == {200}
    assert client.goaways == [ANY_STREAM, max(opened)]


def received(sock, timeout: float) -> bytes:
    """What the server sends until it closes the connection (or `timeout` passes)."""
    data, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        data += chunk
    return data


@http2_paths
def test_connections_that_have_not_spoken_http2_yet_when_the_worker_stops_let_it_stop(start_server, path):
    """A client that has not sent its preface when the worker begins to drain (over TLS, ALPN
    picked h2: HTTP/2 from the handshake on) is told GOAWAY once it does; one that never speaks is
    let go at the drain's wait. The worker stops long before --graceful-timeout: otherwise it
    would serve the first on, and hold its place for the second, until killed."""
    server = serve(start_server, path, "--graceful-timeout", "60")
    (worker,) = server.workers()
    with (
        closing(H2Client(server.port, timeout=10, tls=tls(path))) as settled,
        closing(connect(server.port, 10, tls(path))) as late,
        closing(connect(server.port, 10, tls(path))),  # (silent)
    ):
        settled.request("GET", "/")
        server.signal(signal.SIGHUP)  # a new worker; this one drains: GOAWAY on its connections
        settled.wait_closed()  # (its two GOAWAYs read: the drain began before the preface below)
        assert settled.goaway == 1
        late.sendall(PREFACE + SettingsFrame(0).serialize())
        assert any(isinstance(f, GoAwayFrame) for f in frames(received(late, 10.0)))
        server.wait_for(lambda: worker["pid"] not in {w["pid"] for w in server.workers(None)}, timeout=10,
                        what="the drained worker gone")  # fmt: skip
