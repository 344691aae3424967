"""The WebSocket memory promises (ASGI, HTTP/1.1 paths): messages waiting for the app are bounded
per connection and per worker (--ws-max-memory), deflated ones too, so a flood keeps the worker near
its baseline. The helpers for RSS are tests/promises/test_promises_memory.py's.
"""

from __future__ import annotations

import socket
import threading
import zlib

from conftest import Server
from support.request_paths import over_http11_only
from support.sockets import hang_up
from test_promises_memory import MIB, RssSampler, counts, rss, serve, settles_near

websocket_paths = over_http11_only("a WebSocket is an HTTP/1.1 Upgrade (no RFC 8441 CONNECT over HTTP/2)",
                                   "asgi")  # fmt: skip


def masked(first: int, payload: bytes) -> bytes:
    """A client frame: `first` (FIN, RSV, opcode), the mask bit and length, a mask, the payload."""
    n = len(payload)
    if n < 126:
        length = bytes((0x80 | n,))
    elif n < 1 << 16:
        length = bytes((0x80 | 126,)) + n.to_bytes(2, "big")
    else:
        length = bytes((0x80 | 127,)) + n.to_bytes(8, "big")
    mask = b"\x01\x02\x03\x04"
    key = int.from_bytes((mask * (n // 4 + 1))[:n], "little")
    data = (int.from_bytes(payload, "little") ^ key).to_bytes(n, "little") if n else b""
    return bytes((first,)) + length + mask + data


def deflated(size: int, fin: bool = True) -> bytes:
    """A binary message (or its first fragment: fin False) of `size` zero bytes, compressed
    (permessage-deflate, RFC 7692): 16 MiB make about 16 KiB on the wire."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    payload = c.compress(bytes(size)) + c.flush(zlib.Z_SYNC_FLUSH)
    return masked((0x80 if fin else 0) | 0x40 | 0x02, payload[:-4] if fin else payload)


def deflate_websocket(port: int, path: str) -> socket.socket:
    """A WebSocket whose messages are each compressed on their own (client_no_context_takeover):
    the same frame can be sent again and again."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        "Sec-WebSocket-Extensions: permessage-deflate; client_no_context_takeover\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101 ") and b"permessage-deflate" in head, head
    return sock


def close_code(sock: socket.socket) -> int | None:
    """The code of the close frame the server sends next (None: the connection ended without one)."""
    data = b""
    while True:
        while len(data) >= 2 and len(data) >= 2 + (data[1] & 0x7F):  # short unmasked server frames
            frame, data = data[: 2 + (data[1] & 0x7F)], data[2 + (data[1] & 0x7F) :]
            if frame[0] & 0x0F == 0x8:
                return int.from_bytes(frame[2:4], "big")
        try:
            chunk = sock.recv(4096)
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk


def ws_count(server: Server, path: str) -> tuple[int, int]:
    return counts(server, path)[:2]


def warm_websockets(server: Server, path: str) -> int:
    """One WebSocket message and disconnect first (the worker's first use of wsproto and zlib are
    part of its baseline, not of the flood); the worker's RSS then."""
    pid = server.workers()[0]["pid"]
    warm = deflate_websocket(server.port, "/ws")
    warm.sendall(deflated(MIB))
    server.wait_for(lambda: ws_count(server, path)[0] == 1, what="the warm-up message")
    warm.close()
    server.wait_for(lambda: ws_count(server, path)[1] == 1, what="the warm-up's disconnect")
    return rss(pid)


@websocket_paths
def test_deflated_websocket_messages_for_a_slow_app_keep_the_worker_near_its_baseline(start_server, path):
    """Two clients each send 20 deflated 16 MiB messages (about 320 KiB on the wire) to an app
    that takes one a tenth of a second: each connection holds at most --ws-max-size for its app,
    the rest waits deflated (reading paused), so the worker's RSS stays within 64 MiB of its
    baseline; the app gets every message; once the clients are gone the RSS comes back."""
    server = serve(start_server, path, workers=1)
    pid = server.workers()[0]["pid"]
    baseline = warm_websockets(server, path)
    clients = [deflate_websocket(server.port, "/ws?0.1") for _ in range(2)]
    flood = deflated(16 * MIB) * 20
    with RssSampler(pid) as during:
        for c in clients:
            threading.Thread(target=c.sendall, args=(flood,), daemon=True).start()
        server.wait_for(lambda: ws_count(server, path)[0] == 41, timeout=60, what="every message to the app")
    for c in clients:
        c.close()
    server.wait_for(lambda: ws_count(server, path)[1] == 3, what="the disconnects")
    settles_near(server, pid, baseline, 16 * MIB)
    assert during.peak - baseline < 64 * MIB, (baseline, during.peak)


@websocket_paths
def test_websockets_hold_no_more_than_ws_max_memory_of_a_worker(start_server, path):
    """Four clients flood an app that takes nothing for a while, under --ws-max-memory 24M: the
    worker holds about that for them, whatever they send, and each connection either has every
    message taken by the app or is closed with 1009 (its message could not fit while no app had one
    to take): never the worker killed for its memory."""
    server = serve(start_server, path, "--ws-max-memory", "24M", workers=1)
    pid = server.workers()[0]["pid"]
    baseline = warm_websockets(server, path)
    clients = [deflate_websocket(server.port, "/ws?0.5") for _ in range(4)]
    codes: list[int | None] = []
    readers = [threading.Thread(target=lambda c=c: codes.append(close_code(c)), daemon=True) for c in clients]
    with RssSampler(pid) as during:
        for c, reader in zip(clients, readers, strict=True):
            reader.start()
            threading.Thread(target=c.sendall, args=(deflated(12 * MIB) * 6,), daemon=True).start()
        server.wait_for(lambda: ws_count(server, path)[0] + 6 * len(codes) >= 1 + 24, timeout=60,
                        what="every message taken, or its connection closed")  # fmt: skip
    assert all(code == 1009 for code in codes), codes
    for c in clients:
        hang_up(c)
    server.wait_for(lambda: ws_count(server, path)[1] == 5, what="the disconnects")
    settles_near(server, pid, baseline, 16 * MIB)
    assert during.peak - baseline < 64 * MIB, (baseline, during.peak)
    assert server.workers()[0]["pid"] == pid


@websocket_paths
def test_a_message_that_cannot_fit_in_ws_max_memory_while_no_app_has_one_is_closed_with_1009(
    start_server, path
):
    """Backpressure cannot make room for a message bigger than the worker's whole budget when no app
    holds a message to take: the connection pushing past is closed with 1009, the others go on."""
    server = serve(start_server, path, "--ws-max-memory", "2M", workers=1)
    big = deflate_websocket(server.port, "/ws")
    big.sendall(deflated(3 * MIB, fin=False))  # the first fragment of a message: 3 MiB, and more to come
    assert close_code(big) == 1009
    big.close()
    small = deflate_websocket(server.port, "/ws")
    small.sendall(deflated(MIB) * 3)
    server.wait_for(lambda: ws_count(server, path)[0] == 3, what="the next client's messages")
    small.close()
