"""A tiny RESP server on 127.0.0.1 for redis-py: HELLO, PING, CLIENT ID, and +OK to anything else.

Each accepted connection gets an id (what CLIENT ID returns), so a test sees from the server side
which connections exist and which one each client used.
"""

from __future__ import annotations

import socket
import threading


class FakeRedis:
    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self.open: set[int] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                ident = self.accepted
                self.open.add(ident)
            threading.Thread(target=self._serve, args=(conn, ident), daemon=True).start()

    def _serve(self, conn: socket.socket, ident: int) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline()
                if not line:
                    return
                if not line.startswith(b"*"):
                    continue
                args = []
                for _ in range(int(line[1:])):
                    size = int(reader.readline()[1:])
                    args.append(reader.read(size + 2)[:-2].upper())
                if args[:1] == [b"PING"]:
                    conn.sendall(b"+PONG\r\n")
                elif args[:1] == [b"HELLO"]:  # redis-py 5+ asks for RESP3
                    conn.sendall(b"%%2\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:%d\r\n" % ident)
                elif args[:2] == [b"CLIENT", b"ID"]:
                    conn.sendall(b":%d\r\n" % ident)
                else:
                    conn.sendall(b"+OK\r\n")
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self.open.discard(ident)
            conn.close()

    def close(self) -> None:
        self.server.close()
