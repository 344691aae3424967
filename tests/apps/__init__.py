"""Apps served by the loop-level tests, and a tiny raw-socket client to talk to them."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(TESTS, "support", "harness.py")


class Server:
    """tests/support/harness.py in a subprocess on a random port in 18000-18999."""

    def __init__(self, spec: str, threads: int = 1, interface: str = "wsgi") -> None:
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        for _ in range(10):
            self.port = random.randint(18000, 18999)
            self.proc = subprocess.Popen(
                [sys.executable, HARNESS, spec, interface, str(self.port), str(threads)],
                cwd=TESTS,
                stdout=subprocess.PIPE,
                stderr=self.log,
            )
            assert self.proc.stdout is not None
            if self.proc.stdout.readline().strip() == b"READY":
                return
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError("harness did not start:\n" + self.stderr())

    def connect(self, timeout: float = 10.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self, sig: int | None = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, str]:
        """Signal the server (None: it already was) and wait; returns (exit status, stdout after READY)."""
        if sig is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return self.proc.returncode, out.decode(errors="replace")


class Reader:
    """Reads HTTP/1.1 responses off one socket, keeping leftover bytes for the next one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if not self._fill():
                raise EOFError("connection closed")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise EOFError("connection closed")
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def response(self, head: bool = False) -> tuple[int, dict[str, str], bytes]:
        """One response: (status, headers with lower-case names, body)."""
        status_line = self._line()
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = self._line()
            if not line:
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if head or status in (204, 304) or 100 <= status < 200:
            return status, headers, b""
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int(self._line().split(b";")[0], 16)
                if size == 0:
                    while self._line():
                        pass
                    return status, headers, body
                body += self._exact(size)
                self._exact(2)
        if "content-length" in headers:
            return status, headers, self._exact(int(headers["content-length"]))
        while self._fill():
            pass
        body, self.buf = self.buf, b""
        return status, headers, body

    def closed(self) -> bool:
        """True when the server closed the connection (EOF) with nothing left unread."""
        if self.buf:
            return False
        try:
            return not self._fill()
        except (ConnectionResetError, TimeoutError):
            return True
