"""The promises only HTTP/2 clients can test, on every path that speaks HTTP/2: a client that never
opens its flow-control window costs only its own streams (never an app thread, never the worker's
other clients), and connections left idle are closed as the settings say.

Their HTTP/1.1 counterparts (a client that never reads, an idle keep-alive connection) are in
test_promises.py and tests/serving/test_connection_timeouts.py.
"""

from __future__ import annotations

import select
import socket
import time
from contextlib import ExitStack, closing

from conftest import Server, read_to_end
from h2.settings import SettingCodes
from support import h2client
from support.h2client import H2Client
from support.request_paths import connect, flags, http2_paths, tls


def serve(start_server, path: str, *args: str) -> Server:
    chosen, app = flags(path, "apps.promises")
    return start_server(*chosen, *args, app=app, workers=1, defaults=True)


@http2_paths
def test_clients_that_never_open_their_window_cost_only_their_streams(start_server, path):
    """2 connections x 8 streams of a 1 MB response, their windows shut (the default 30 s write
    timeout): every other client is served meanwhile, on a worker of one process."""
    server = serve(start_server, path)
    with ExitStack() as stack:
        for _ in range(2):
            shut = {SettingCodes.INITIAL_WINDOW_SIZE: 0}
            client = stack.enter_context(closing(H2Client(server.port, settings=shut, tls=tls(path))))
            for _ in range(8):
                client.send("GET", "/big?1000000")
        for _ in range(10):  # fresh clients, one after another, each answered in time
            status, body = h2client.get(server.port, "/", 5.0, tls(path))
            assert status == 200 and body
            with connect(path, server.port, 5.0) as sock:  # HTTP/1.1 on the same port (over TLS: by ALPN)
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert read_to_end(sock).startswith(b"HTTP/1.1 200 ")


def _closed_within(socks: list[socket.socket], seconds: float) -> int:
    """How many of `socks` the server closed within `seconds` (what it sends first is read and dropped)."""
    deadline = time.monotonic() + seconds
    open_ = list(socks)
    while open_ and (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select(open_, [], [], left)
        for sock in readable:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                open_.remove(sock)
    return len(socks) - len(open_)


@http2_paths
def test_idle_http2_connections_are_closed(start_server, path):
    """Connections that open HTTP/2 and send no request are closed at --header-timeout, those
    whose last stream ended at --keepalive (as docs/http2.md says), on every HTTP/2 path."""
    server = serve(start_server, path, "--keepalive", "2", "--header-timeout", "3")
    with ExitStack() as stack:
        fresh = [stack.enter_context(closing(H2Client(server.port, tls=tls(path)))).sock for _ in range(5)]
        used = []
        for _ in range(5):
            client = stack.enter_context(closing(H2Client(server.port, tls=tls(path))))
            assert client.request("GET", "/")[0] == 200
            used.append(client.sock)
        assert _closed_within(used, 2 + 3) == 5
        assert _closed_within(fresh, 3 + 3) == 5
