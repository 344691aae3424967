"""A raw WebSocket client (frames by hand) and the opcodes, for tests that need byte control; for the
others, the test app (APP), a server's ws:// URL and an open `websockets` client."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import time
from typing import Any

from websockets.sync.client import ClientConnection, connect

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONT, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
APP = "apps.ws_apps:app"


class RawWebSocket:
    """A WebSocket client written against RFC 6455 directly: it sends whatever frame a test
    builds (bad ones included) and reads the server's frames as they are on the wire."""

    def __init__(self, port: int, path: str = "/echo", headers: dict[str, str] | None = None,
                 version: str = "13", key: bytes | None = None, timeout: float = 10.0) -> None:  # fmt: skip
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.key = base64.b64encode(os.urandom(16)) if key is None else key
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {self.key.decode()}",
            f"Sec-WebSocket-Version: {version}",
            *(f"{k}: {v}" for k, v in (headers or {}).items()),
        ]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buf = b""
        head = self._read_until(b"\r\n\r\n")
        status_line, *fields = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}

    def accepted(self) -> bool:
        expected = base64.b64encode(hashlib.sha1(self.key + GUID).digest()).decode()
        return self.status == 101 and self.headers.get("sec-websocket-accept") == expected

    def _read_until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError(f"closed before {marker!r}: {self.buf!r}")
            self.buf += data
        head, _, self.buf = self.buf.partition(marker)
        return head

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            data = self.sock.recv(max(65536, n - len(self.buf)))
            if not data:
                raise ConnectionError("closed by the server")
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def body(self) -> bytes:
        """The rest of an HTTP response (a refused handshake), up to the server's close."""
        chunks = [self.buf]
        while data := self.sock.recv(65536):
            chunks.append(data)
        return b"".join(chunks)

    def send_frame(self, opcode: int, payload: bytes = b"", *, fin: bool = True, rsv: int = 0,
                   mask: bool = True, length_bytes: int | None = None) -> None:  # fmt: skip
        """One frame; `length_bytes` forces the 16-bit (2) or 64-bit (8) length form."""
        head = bytes([(0x80 if fin else 0) | (rsv << 4) | opcode])
        n = len(payload)
        bit = 0x80 if mask else 0
        if length_bytes == 8 or (length_bytes is None and n > 0xFFFF):
            head += bytes([bit | 127]) + struct.pack("!Q", n)
        elif length_bytes == 2 or (length_bytes is None and n > 125):
            head += bytes([bit | 126]) + struct.pack("!H", n)
        else:
            head += bytes([bit | n])
        if mask:
            key = os.urandom(4)
            payload = (
                bytes(b ^ key[i % 4] for i, b in enumerate(payload)) if n < 4096 else _mask(payload, key)
            )
            head += key
        self.sock.sendall(head + payload)

    def recv_frame(self) -> tuple[bool, int, bytes, int]:
        """(fin, opcode, payload, length bytes used: 0, 2 or 8); the server must not mask."""
        b0, b1 = self._read(2)
        assert not b1 & 0x80, "a server frame must not be masked (RFC 6455 5.1)"
        n, used = b1 & 0x7F, 0
        if n == 126:
            (n,), used = struct.unpack("!H", self._read(2)), 2
        elif n == 127:
            (n,), used = struct.unpack("!Q", self._read(8)), 8
        return bool(b0 & 0x80), b0 & 0x0F, self._read(n), used

    def recv_message(self) -> tuple[int, bytes]:
        """The next data message (control frames other than close skipped)."""
        opcode, parts = None, []
        while True:
            fin, op, payload, _ = self.recv_frame()
            if op in (PING, PONG):
                continue
            if op == CLOSE:
                raise AssertionError(f"closed: {close_code(payload)}")
            opcode = op if opcode is None else opcode
            parts.append(payload)
            if fin:
                return opcode, b"".join(parts)

    def expect_close(self, timeout: float = 10.0) -> tuple[int | None, bytes]:
        """Read until the server's close frame: (code, reason); data frames before it are skipped."""
        self.sock.settimeout(timeout)
        while True:
            _, op, payload, _ = self.recv_frame()
            if op == CLOSE:
                return close_code(payload), payload[2:]

    def expect_eof(self, timeout: float = 10.0) -> None:
        """The server closes the TCP connection (after its close frame)."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return
            if not data:
                return
        raise AssertionError("the server did not close the connection")

    def close(self) -> None:
        self.sock.close()


def _mask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    k = int.from_bytes((key * (n // 4 + 1))[:n], "big")
    return (int.from_bytes(payload, "big") ^ k).to_bytes(n, "big")


def close_code(payload: bytes) -> int | None:
    return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None


def url(server: Any, path: str = "/echo") -> str:
    return f"ws://127.0.0.1:{server.port}{path}"


def open_client(server: Any) -> ClientConnection:
    """A sync `websockets` client kept open across statements: entered as its context manager
    (websockets 17 warns otherwise and offers legacy=True, which 16, the last for 3.10, lacks)."""
    return connect(url(server), ping_interval=None).__enter__()
