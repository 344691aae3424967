"""An ASGI server in a subprocess for raw-socket tests, and the reader of its HTTP/1.1 responses.

`Proc` runs tests/support/harness.py (uvloop) or RUNNER (any loop, and a fork at a safe point);
the `serve` fixture in tests/conftest.py starts them and kills what is left after a test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from conftest import free_port

from support import paths

TESTS = paths.TESTS


RUNNER = r"""
import os, signal, socket, sys
sys.path[:0] = [os.environ["TESTS_DIR"], os.path.dirname(os.environ["TESTS_DIR"])]
from support.harness import HarnessControl
from refork.config import Config
from refork.serving import serve
import importlib

spec, loop, bind, mode = sys.argv[1:5]
module, _, attr = spec.partition(":")
app = getattr(importlib.import_module(module), attr)

class Promoted(SystemExit):
    pass

class Control(HarnessControl):
    def __init__(self):
        super().__init__()
        self.want = False
    @property
    def safe_point_wanted(self):
        return self.want
    def request_finished(self, token, status):
        super().request_finished(token, status)
        if mode == "fork" and self.served == 1:
            self.want = True  # promote after the first response
    def at_safe_point(self):
        self.want = False
        import threading
        if threading.active_count() != 1:
            raise RuntimeError(f"threads alive at the safe point: {threading.enumerate()}")
        pid = os.fork()
        if pid == 0:
            raise Promoted(0)
        os.write(1, f"FORKED {pid}\n".encode())

if bind.startswith("unix:"):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(bind[5:])
else:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", int(bind)))
sock.listen(128)
sock.setblocking(False)
config = Config(app=spec, loop=loop, keepalive=1.0, header_timeout=1.0,
                access_logfile=os.environ.get("ACCESS_LOG"))
control = Control()
signal.signal(signal.SIGTERM, lambda *_: control.signal(b"T"))
signal.signal(signal.SIGINT, lambda *_: control.signal(b"I"))
print("READY", flush=True)
parent = os.getpid()
try:
    serve([sock], app, "asgi", config, control)
except Promoted:
    import time
    os.write(1, b"CHILD UNWOUND\n")
    os.close(1); os.close(2)
    # A mold lives on (its copies of client sockets must not keep them open): as long as the
    # server it was forked from, then it goes by itself.
    while os.getppid() == parent:
        time.sleep(0.05)
    os._exit(0)
print(f"SERVED {control.served}", flush=True)
"""


class Proc:
    """A serving subprocess: tests/support/harness.py (uvloop) or RUNNER (any loop, fork)."""

    def __init__(self, spec: str, *, loop: str | None = None, mode: str = "plain", env=None, unix: str = ""):
        self.port = free_port()
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TESTS_DIR": str(TESTS), **(env or {})}
        if loop is None:
            cmd = [sys.executable, str(TESTS / "support" / "harness.py"), spec, "asgi", str(self.port)]
        else:
            bind = f"unix:{unix}" if unix else str(self.port)
            cmd = [sys.executable, "-c", RUNNER, spec, loop, bind, mode]
        self.proc = subprocess.Popen(
            cmd, cwd=TESTS, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        if "READY" not in line:
            self.proc.kill()
            raise AssertionError(f"server did not start: {line!r} {self.proc.stderr.read()}")
        self.lines: list[str] = []

    def connect(self, timeout: float = 5.0) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def finish(self, sig=signal.SIGTERM, timeout: float = 10.0) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def read_response(sock: socket.socket, buf: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """Read exactly one response (Content-Length, chunked or until EOF) from a raw socket.

    Responses to pipelined requests may arrive in one recv(): read them all through one shared
    `buf`. Without one, bytes past this response would be lost, so they fail the test at once
    (rather than the next read waiting for a close that only the keep-alive timeout brings).
    """
    if buf is None:
        buf = bytearray()
        response = _read_response(sock, buf)
        assert not buf, f"bytes after the response (pass a shared buf): {bytes(buf[:80])!r}"
        return response
    return _read_response(sock, buf)


def _read_response(sock: socket.socket, buf: bytearray) -> tuple[int, dict[str, str], bytes]:

    def fill() -> bool:
        data = sock.recv(65536)
        buf.extend(data)
        return bool(data)

    while b"\r\n\r\n" not in buf:
        if not fill():
            raise ConnectionError(f"EOF before head: {bytes(buf)!r}")
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    del buf[: len(head) + 4]
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if status == 100 or status == 204 or status == 304:
        return status, headers, b""
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n and fill():
            pass
        body = bytes(buf[:n])
        del buf[:n]
    elif headers.get("transfer-encoding") == "chunked":
        chunks = bytearray()
        while True:
            while b"\r\n" not in buf:
                fill()
            size_line, _, _ = bytes(buf).partition(b"\r\n")
            size = int(size_line, 16)
            del buf[: len(size_line) + 2]
            while len(buf) < size + 2:
                fill()
            chunks += buf[:size]
            del buf[: size + 2]
            if size == 0:
                break
        body = bytes(chunks)
    else:
        while fill():
            pass
        body = bytes(buf)
        buf.clear()
    return status, headers, body


def exchange(proc: Proc, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with proc.connect() as sock:
        sock.sendall(raw)
        return read_response(sock)


def at_eof(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
