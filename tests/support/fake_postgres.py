"""Just enough of the PostgreSQL protocol for libpq to connect (no queries): trust auth, then idle.

For tests of what happens to a psycopg/psycopg2 connection across a fork, where only the
connection itself matters. The real server is in the proof tests.
"""

from __future__ import annotations

import socket
import struct
import threading

PARAMETERS = {"server_version": "16.0", "client_encoding": "UTF8", "standard_conforming_strings": "on",
              "DateStyle": "ISO, MDY", "integer_datetimes": "on", "server_encoding": "UTF8"}  # fmt: skip


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


class FakePostgres:
    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.open = 0
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        try:
            while True:  # SSLRequest / GSSENCRequest: refused; then the startup message
                length, code = struct.unpack("!ii", reader.read(8))
                if code in (80877103, 80877104):
                    conn.sendall(b"N")
                    continue
                reader.read(length - 8)
                break
            reply = _message(b"R", struct.pack("!i", 0))
            for key, value in PARAMETERS.items():
                reply += _message(b"S", key.encode() + b"\0" + value.encode() + b"\0")
            reply += _message(b"K", struct.pack("!ii", 1, 2)) + _message(b"Z", b"I")
            conn.sendall(reply)
            self.open += 1
            try:
                while reader.read(1):  # until Terminate ('X') and close, or the peer goes away
                    pass
            finally:
                self.open -= 1
        except (OSError, struct.error):
            return
        finally:
            conn.close()

    def close(self) -> None:
        self.server.close()
