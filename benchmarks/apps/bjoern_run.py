"""Run bjoern (a single-process WSGI server) as N forked processes sharing one listening socket.

Usage: python bjoern_run.py MODULE:APP HOST PORT WORKERS
"""

import importlib
import os
import signal
import socket
import sys
from types import FrameType

import bjoern


def load(spec: str) -> object:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr or "app")


def main() -> None:
    spec, host, port, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.path.insert(0, os.getcwd())
    app = load(spec)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)

    children = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            bjoern.server_run(sock, app)
            os._exit(0)
        children.append(pid)

    def stop(signum: int, frame: FrameType | None) -> None:
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in children:
        try:
            os.wait()
        except ChildProcessError:
            break


if __name__ == "__main__":
    main()
