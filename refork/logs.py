"""Error log (the "refork" logger) and access log (refork.log_format's formats), reopened on USR1.

The access log is on the request hot path: one compiled line function, one write to a
line-buffered file under a lock. Locks are reentrant so reopen() is safe even from a signal
handler on the main thread.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import weakref
from logging.handlers import SysLogHandler
from typing import IO, Any

from refork.config import Config
from refork.errors import ConfigError
from refork.http.events import Request
from refork.log_format import GUNICORN_DEFAULT, compile_format

LOG_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"

_open_access_logs: weakref.WeakSet[AccessLog] = weakref.WeakSet()


def check_log_files(config: Config) -> None:
    """The log files open for appending, or one line naming the file and why (exit 2)."""
    files = (("--error-logfile", config.error_logfile), ("--access-logfile", config.access_logfile))
    for flag, path in files:
        if path and path != "-":
            try:
                with open(path, "a", encoding="utf-8"):
                    pass
            except OSError as e:
                folder = os.path.dirname(os.path.abspath(path))
                hint = "; create the directory" if not os.path.isdir(folder) else ""
                raise ConfigError(f"{flag} {path}: {e.strerror}{hint}") from None


def setup_logging(config: Config) -> logging.Logger:
    """Configure the "refork" logger: gunicorn-like lines to stderr or config.error_logfile, and
    syslog; then gunicorn's logconfig_dict / logconfig_json / logconfig, where "gunicorn.error" is
    another name of the "refork" logger."""
    logger = logging.getLogger("refork")
    for old in list(logger.handlers):
        logger.removeHandler(old)
        if isinstance(old, (logging.FileHandler, SysLogHandler)):
            old.close()
    handler: logging.Handler
    if config.error_logfile in ("-", ""):
        handler = logging.StreamHandler(sys.stderr)
    else:
        try:
            handler = logging.FileHandler(config.error_logfile, mode="a", encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"--error-logfile {config.error_logfile}: {e.strerror}") from None
        if config.capture_output:  # print() and tracebacks of every process go to the file too
            sys.stdout.flush()
            sys.stderr.flush()
            fd = handler.stream.fileno()  # type: ignore[union-attr]
            os.dup2(fd, 1)
            os.dup2(fd, 2)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, DATE_FORMAT))
    logger.addHandler(handler)
    if config.syslog:
        logger.addHandler(syslog_handler(config))
    logger.setLevel(config.log_level.upper())
    logger.propagate = False
    _user_logging(config, logger)
    return logger


def syslog_handler(config: Config) -> logging.Handler:
    """gunicorn's --log-syslog: unix://PATH[#dgram|#stream], udp://HOST:PORT, tcp://HOST:PORT."""
    scheme, _, rest = config.syslog_addr.partition("://")
    address: str | tuple[str, int]
    socktype = socket.SOCK_DGRAM
    if scheme == "unix":
        address, _, kind = rest.partition("#")
        socktype = socket.SOCK_STREAM if kind == "stream" else socket.SOCK_DGRAM
    else:
        host, _, port = rest.rpartition(":")
        address = (host.strip("[]") or "localhost", int(port or 514))
        socktype = socket.SOCK_STREAM if scheme == "tcp" else socket.SOCK_DGRAM
    try:
        handler = SysLogHandler(address, SysLogHandler.facility_names[config.syslog_facility], socktype)
    except OSError as e:
        raise ConfigError(f"--log-syslog-to {config.syslog_addr}: {e.strerror or e}") from None
    name = f"refork.{config.syslog_prefix}" if config.syslog_prefix else config.proc_name
    handler.setFormatter(logging.Formatter(f"{name}: [%(process)d] [%(levelname)s] %(message)s"))
    return handler


def _user_logging(config: Config, logger: logging.Logger) -> None:
    """logconfig_dict (first), else logconfig_json, else logconfig (fileConfig), as gunicorn."""
    import logging.config

    try:
        if config.logconfig_dict:
            logging.config.dictConfig({"disable_existing_loggers": False, **config.logconfig_dict})
        elif config.logconfig_json:
            with open(config.logconfig_json, encoding="utf-8") as f:
                logging.config.dictConfig({"disable_existing_loggers": False, **json.load(f)})
        elif config.logconfig:
            if not os.path.exists(config.logconfig):
                raise ConfigError(f"--log-config {config.logconfig}: no such file")
            logging.config.fileConfig(config.logconfig, disable_existing_loggers=False)
        else:
            return
    except ConfigError:
        raise
    except (OSError, ValueError, TypeError, AttributeError, ImportError, KeyError) as e:
        raise ConfigError(f"the logging config does not apply: {type(e).__name__}: {e}") from None
    alias = logging.getLogger("gunicorn.error")  # what gunicorn configs name the error log
    if alias.handlers:
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        for handler in alias.handlers:
            logger.addHandler(handler)
        if alias.level:
            logger.setLevel(alias.level)
    logger.disabled = False


def log_notes(config: Config) -> None:
    """The lines loading left for the start: gunicorn settings refork does not need, or does its
    own way, and likely typos in the config file."""
    for level, text in config.notes:
        logging.getLogger("refork").log(level, "%s", text)


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
