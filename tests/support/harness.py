"""Run one connection loop (refork.serving.serve) in this process, without the process model.

Used by loop-level tests: `python tests/support/harness.py MODULE:ATTR wsgi|asgi PORT [threads]` binds
127.0.0.1:PORT, prints "READY" and serves until SIGTERM (graceful) or SIGINT (immediate).
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import sys
import threading
import time

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _TESTS)  # the apps
sys.path.insert(0, os.path.dirname(_TESTS))  # refork

from refork.config import Config  # noqa: E402
from refork.errors import StartupError  # noqa: E402
from refork.serving import serve  # noqa: E402


class HarnessControl:
    """A minimal WorkerControl: signals instead of a monitor."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)
        self._stopping = False
        self._exit_now = False
        self._lock = threading.Lock()
        self.in_flight = 0
        self.served = 0

    def fileno(self) -> int:
        return self._r.fileno()

    def on_readable(self) -> None:
        try:
            data = self._r.recv(64)
        except BlockingIOError:
            return
        if b"T" in data:
            self._stopping = True
        if b"I" in data:
            self._exit_now = True

    def signal(self, code: bytes) -> None:
        self._w.send(code)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def exit_now(self) -> bool:
        return self._exit_now

    @property
    def safe_point_wanted(self) -> bool:
        return False

    def ready_for_requests(self) -> None:
        pass

    def at_safe_point(self) -> None:
        pass

    def request_started(self, method: str, path: bytes) -> object:
        with self._lock:
            self.in_flight += 1
        return time.monotonic()

    def request_waiting(self, token: object) -> None:
        pass

    def request_resumed(self, token: object) -> None:
        pass

    def request_upgraded(self, token: object) -> None:
        pass

    def http2_count(self, what: str, n: int = 1) -> None:
        pass

    def static_count(self, status: int) -> None:
        pass

    def request_finished(self, token: object, status: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.served += 1

    def health(self, kind: str) -> int:
        return 200

    @property
    def free_threads_elsewhere(self) -> bool:
        return False  # the only loop

    def free_threads_address(self) -> int:
        return 0

    @property
    def server_draining(self) -> bool:
        return False

    websocket_grace = 0.0

    def tick(self) -> None:
        pass


def main() -> None:
    spec, interface, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    module, _, attr = spec.partition(":")
    app = getattr(importlib.import_module(module), attr)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    sock.setblocking(False)
    loop = os.environ.get("REFORK_WSGI_LOOP", "auto")  # the suites run once per WSGI loop
    config = Config(app=spec, threads=threads, keepalive=2.0, header_timeout=2.0, wsgi_loop=loop)
    control = HarnessControl()
    signal.signal(signal.SIGTERM, lambda *_: control.signal(b"T"))
    signal.signal(signal.SIGINT, lambda *_: control.signal(b"I"))
    print("READY", flush=True)
    try:
        serve([sock], app, interface, config, control)
    except StartupError as e:  # as a worker reports it: one line
        print(f"{e}; worker exiting", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"SERVED {control.served}", flush=True)


if __name__ == "__main__":
    main()
