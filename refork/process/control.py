"""The control socket: `refork status`, `refork reload` and friends talk to the monitor through it.

One JSON object per line each way over a Unix stream socket; requests are tiny and answered in
the monitor's loop, so the monitor stays single-threaded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
from typing import Any, Protocol

from refork.config import Config

log = logging.getLogger("refork")


def default_path(proc_name: str) -> str:
    """Where the control socket lives unless --control-socket says otherwise."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(base, f"{proc_name}.ctl")


class Commands(Protocol):
    """What the control socket asks of the monitor (refork.process.monitor.Monitor)."""

    def status(self) -> dict[str, Any]: ...
    def refork_now(self) -> bool: ...
    def reload(self) -> str | None: ...
    def set_worker_count(self, count: int) -> None: ...
    @property
    def target_workers(self) -> int: ...


class ControlServer:
    def __init__(self, listener: socket.socket | None, path: str | None, commands: Commands) -> None:
        self.listener = listener
        self.path = path
        self.commands = commands
        self.clients: dict[socket.socket, bytes] = {}

    @classmethod
    def open(cls, config: Config, commands: Commands) -> ControlServer:
        path = config.control_socket or default_path(config.proc_name)
        if path == "off":
            return cls(None, None, commands)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if os.path.exists(path):
                probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    probe.connect(path)
                    probe.close()
                    log.warning(
                        "control socket %s is in use by another refork; `refork status` "
                        "will not reach this one (set --control-socket)",
                        path,
                    )
                    listener.close()
                    return cls(None, None, commands)
                except OSError:
                    probe.close()
                    os.unlink(path)
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(16)
            listener.setblocking(False)
        except OSError as e:
            listener.close()
            log.warning("control socket %s unavailable: %s", path, e.strerror)
            return cls(None, None, commands)
        log.info("control socket: %s", path)
        return cls(listener, path, commands)

    def sockets(self) -> list[socket.socket]:
        return ([self.listener] if self.listener else []) + list(self.clients)

    def on_readable(self, sock: socket.socket) -> None:
        if sock is self.listener:
            with contextlib.suppress(BlockingIOError, InterruptedError):
                client, _ = sock.accept()
                client.setblocking(False)
                self.clients[client] = b""
            return
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        buffer = self.clients.get(sock, b"") + data
        if not data or b"\n" in buffer or len(buffer) > 65536:
            line = buffer.split(b"\n", 1)[0]
            reply = self._answer(line)  # may fork a mold: sock must still be listed for it to close
            self.clients.pop(sock, None)
            with contextlib.suppress(OSError):
                sock.setblocking(True)
                sock.settimeout(2.0)
                sock.sendall(json.dumps(reply).encode() + b"\n")
            sock.close()
        else:
            self.clients[sock] = buffer

    def _answer(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line or b"{}")
            command = request.get("command", "status")
        except (ValueError, AttributeError):
            return {"ok": False, "error": "bad request: send one JSON object per line"}
        if command == "status":
            return {"ok": True, **self.commands.status()}
        if command == "refork":
            started = self.commands.refork_now()
            return {"ok": started, **({} if started else {"error": "no promotable worker (see the log)"})}
        if command == "reload":
            refused = self.commands.reload()
            if refused:
                return {"ok": False, "error": f"reload refused: {refused}"}
            message = "reloading: a new mold is importing the app; `refork status` shows the rollout"
            return {"ok": True, "message": message}
        if command in ("ttin", "ttou"):
            delta = 1 if command == "ttin" else -1
            self.commands.set_worker_count(self.commands.target_workers + delta)
            return {"ok": True, "workers": self.commands.target_workers}
        return {"ok": False, "error": f"unknown command {command!r}"}

    def close(self) -> None:
        for client in list(self.clients):
            client.close()
        self.clients.clear()
        if self.listener is not None:
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # type: ignore[arg-type]


def request(path: str, command: str, timeout: float = 10.0) -> dict[str, Any]:
    """Client side: send one command, return the monitor's answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps({"command": command}).encode() + b"\n")
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    answer: dict[str, Any] = json.loads(b"".join(chunks))
    return answer
