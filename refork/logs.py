"""Error log (the "refork" logger) and access log (common / combined / json), reopened on USR1.

The access log is on the request hot path: one %-format, one write to a line-buffered file
under a lock. Locks are reentrant so reopen() is safe even from a signal handler on the main
thread.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
import weakref
from typing import IO

from refork.config import Config

LOG_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_UNSAFE = re.compile(r'["\\\x00-\x1f\x7f-\xff]')

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


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return "\\" + c if c in '"\\' else f"\\x{ord(c):02x}"


def _clean(text: str) -> str:
    """Apache-style escaping so a client cannot forge log lines or break quoting."""
    return _UNSAFE.sub(_escape_char, text) if _UNSAFE.search(text) else text


class AccessLog:
    """One line per response, in the "common", "combined" or "json" format."""

    def __init__(self, path: str, fmt: str = "common") -> None:
        if fmt not in ("common", "combined", "json"):
            raise ValueError(f"unknown access log format {fmt!r}")
        self.path = path
        self.format = fmt
        self._lock = threading.RLock()
        self._stamp: tuple[int, str] = (-1, "")
        self._file: IO[str] = self._open()
        _open_access_logs.add(self)

    @classmethod
    def from_config(cls, config: Config) -> AccessLog | None:
        """None when the access log is off (config.access_logfile is None)."""
        if config.access_logfile is None:
            return None
        return cls(config.access_logfile, config.access_log_format)

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

    def _timestamp(self, now: float) -> str:
        """[22/Nov/2026:12:00:00 +0000], local time, formatted once per second."""
        second = int(now)
        stamp = self._stamp  # one tuple: threads never see a half-updated cache
        if stamp[0] != second:
            t = time.localtime(second)
            stamp = self._stamp = (second, time.strftime(f"%d/{_MONTHS[t.tm_mon - 1]}/%Y:%H:%M:%S %z", t))
        return stamp[1]

    def log(
        self,
        *,
        remote: str,
        method: str,
        target: bytes,
        http_version: str,
        status: int,
        length: int,
        duration: float,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """Write one line; headers are the request headers (lower-case names)."""
        proto = http_version if http_version.startswith("HTTP/") else "HTTP/" + http_version
        fmt = self.format
        referer = agent = None
        if fmt != "common":
            for name, value in headers:
                if name == b"referer":
                    referer = value.decode("latin-1")
                elif name == b"user-agent":
                    agent = value.decode("latin-1")
        now = time.time()
        if fmt == "json":
            path, _, query = target.decode("utf-8", "backslashreplace").partition("?")
            line = json.dumps(
                {
                    "ts": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(now))}.{int(now % 1 * 1e3):03d}Z",
                    "remote": remote,
                    "method": method,
                    "path": path,
                    "query": query,
                    "proto": proto,
                    "status": status,
                    "bytes": length,
                    "duration_ms": round(duration * 1000, 3),
                    "referer": referer,
                    "user_agent": agent,
                    "pid": os.getpid(),
                },
                separators=(",", ":"),
            )
        else:
            line = (
                f'{remote} - - [{self._timestamp(now)}] "{_clean(method)} {_clean(target.decode("latin-1"))} '
                f'{proto}" {status} {length or "-"}'
            )
            if fmt == "combined":
                line += f' "{_clean(referer) if referer else "-"}" "{_clean(agent) if agent else "-"}"'
        with self._lock:
            self._file.write(line + "\n")
            if self.path == "-":
                self._file.flush()

    def __repr__(self) -> str:
        return f"AccessLog({self.path!r}, {self.format!r})"
