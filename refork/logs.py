"""Error log (the "refork" logger) and access log (refork.log_format's formats), reopened on USR1.

The access log is on the request hot path: one compiled line function, one write to a
line-buffered file under a lock. Locks are reentrant so reopen() is safe even from a signal
handler on the main thread.
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from typing import IO, Any

from refork.config import Config
from refork.http.events import Request
from refork.log_format import GUNICORN_DEFAULT, compile_format

LOG_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"

_open_access_logs: weakref.WeakSet[AccessLog] = weakref.WeakSet()


def setup_logging(config: Config) -> logging.Logger:
    """Configure the "refork" logger: gunicorn-like lines to stderr or config.error_logfile."""
    logger = logging.getLogger("refork")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        if isinstance(handler, logging.FileHandler):
            handler.close()
    if config.error_logfile in ("-", ""):
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.FileHandler(config.error_logfile, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    logger.addHandler(handler)
    logger.setLevel(config.log_level.upper())
    logger.propagate = False
    return logger


def reopen_log_files() -> None:
    """USR1 (logrotate): reopen the error log file and every access log file, in append mode."""
    for handler in logging.getLogger("refork").handlers:
        if isinstance(handler, logging.FileHandler):
            handler.acquire()  # an RLock
            try:
                if handler.stream:
                    handler.stream.close()
                handler.stream = handler._open()
            finally:
                handler.release()
    for access_log in list(_open_access_logs):
        access_log.reopen()


class AccessLog:
    """One line per response, in a format of refork.log_format (gunicorn's atoms, or common,
    combined, json), written to a line-buffered file under a lock."""

    def __init__(self, path: str, fmt: str = GUNICORN_DEFAULT, asgi: bool = False) -> None:
        self.path = path
        self.format = fmt
        self.line = compile_format(fmt, asgi)
        self._lock = threading.RLock()
        self._file: IO[str] = self._open()
        _open_access_logs.add(self)

    @classmethod
    def from_config(cls, config: Config, asgi: bool = False) -> AccessLog | None:
        """None when the access log is off (config.access_logfile is None); `asgi`: for the ASGI
        loop (see refork.log_format.compile_format)."""
        if config.access_logfile is None:
            return None
        return cls(config.access_logfile, config.access_log_format, asgi)

    def _open(self) -> IO[str]:
        if self.path == "-":
            return sys.stdout
        return open(self.path, "a", buffering=1, encoding="utf-8", errors="backslashreplace")

    def reopen(self) -> None:
        """Open the file again (after logrotate moved it); stdout is left as is."""
        if self.path == "-":
            return
        new = self._open()
        with self._lock:
            old, self._file = self._file, new
        old.close()

    def close(self) -> None:
        _open_access_logs.discard(self)
        with self._lock:
            if self.path != "-":
                self._file.close()

    def write(
        self,
        request: Request,
        remote: str | None,
        status: int,
        length: int,
        duration: float,
        environ: dict[str, Any] | None = None,
        response_headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Write the line of one response (see refork.log_format for the arguments)."""
        line = self.line(request, remote, status, length, duration, environ, response_headers)
        with self._lock:
            self._file.write(line + "\n")
            if self.path == "-":
                self._file.flush()

    def __repr__(self) -> str:
        return f"AccessLog({self.path!r}, {self.format!r})"
