"""Error log (the "refork" logger) and access log (refork.log_format's formats), reopened on USR1.

The access log is on the request hot path: one compiled line function, one write(2) under a lock.
Locks are reentrant so reopen() is safe even from a signal handler on the main thread.

A log that cannot be written (a full disk, EIO, a deleted directory) never fails the server: its
lost lines are counted and told in one line at most every REPORT_EVERY seconds (:class:`LostLines`),
never a traceback per line; a reopen that fails keeps the file it had open and says so in one line.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TextIO

from refork.config import Config
from refork.errors import ConfigError
from refork.http.events import Request
from refork.log_format import GUNICORN_DEFAULT, compile_format

LOG_FORMAT = "[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S %z"

REPORT_EVERY = 10.0  # seconds: a failing log tells its lost lines at most this often

log = logging.getLogger("refork")
_open_access_logs: weakref.WeakSet[AccessLog] = weakref.WeakSet()
_count_lost: Callable[[str], None] | None = None  # see count_lost_lines


def count_lost_lines(count: Callable[[str], None]) -> None:
    """Count this process's lost lines into `count(log)`, log "access" or "error" (the worker's
    slot: the refork_log_write_errors_total metric)."""
    global _count_lost
    _count_lost = count


def _errno_text(error: OSError) -> str:
    """The errno's name (for grep) and its text: "ENOSPC: No space left on device"."""
    name = errno.errorcode.get(error.errno or 0, "")
    return f"{name}: {error.strerror}" if name else str(error.strerror or error)


def _to_stderr(text: str) -> None:
    """One line on fd 2, in the error log's format, straight to the kernel (sys.stderr may hold
    the failed lines in its buffer); a failure is dropped: there is nowhere else to tell it."""
    stamp = time.strftime(DATE_FORMAT)
    try:
        os.write(2, f"[{stamp}] [{os.getpid()}] [WARNING] {text}\n".encode("utf-8", "backslashreplace"))
    except OSError:
        pass


class LostLines:
    """The lines one log could not write: counted, and told by `tell` at most every REPORT_EVERY
    seconds with the last error (the first at once), and once more when writing works again."""

    def __init__(self, name: str, log: str, tell: Callable[[str], None]) -> None:
        self.name = name  # "access log /var/log/app.log"
        self.log = log  # "access" or "error", as count_lost_lines counts it
        self.tell = tell
        self.total = 0  # lines lost since the process started
        self.pending = 0  # lines lost since the last report
        self.error: OSError | None = None
        self._next_report = 0.0

    def failed(self, error: OSError) -> None:
        """One line lost to `error`."""
        self.total += 1
        self.pending += 1
        self.error = error
        if _count_lost is not None:
            _count_lost(self.log)
        now = time.monotonic()
        if now >= self._next_report:
            self._report(now, f"{self.pending} line(s) lost ({_errno_text(error)}); "
                              f"told at most every {REPORT_EVERY:g} s")  # fmt: skip

    def written(self) -> None:
        """A line written again, after some were lost (the caller checks `pending` first)."""
        now = time.monotonic()
        if now >= self._next_report:
            error = _errno_text(self.error) if self.error else "?"
            self._report(now, f"writing again; {self.pending} more line(s) lost ({error})")

    def _report(self, now: float, text: str) -> None:
        self._next_report = now + REPORT_EVERY
        self.pending = 0
        try:
            self.tell(f"{self.name}: {text}")
        except Exception:  # noqa: BLE001 - a report must never fail the write it is about
            pass


class _CountsLostLines(logging.Handler):
    """An error-log handler whose failed writes (OSError) are counted and told on stderr at most
    every REPORT_EVERY seconds, instead of logging's traceback per line (Handler.handleError);
    any other error (a bad format in a message) keeps that traceback."""

    lost: LostLines

    def emit(self, record: logging.LogRecord) -> None:
        pending = self.lost.pending
        super().emit(record)
        if pending and self.lost.pending == pending:  # this one went through
            self.lost.written()

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            self.lost.failed(error)
        else:
            super().handleError(record)


class ErrorLogStream(_CountsLostLines, logging.StreamHandler):  # type: ignore[type-arg]
    """The error log on stderr (`--error-logfile -`)."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self.lost = LostLines("error log (stderr)", "error", _to_stderr)


class ErrorLogFile(_CountsLostLines, logging.FileHandler):
    """The error log in `--error-logfile FILE`."""

    def __init__(self, path: str) -> None:
        super().__init__(path, mode="a", encoding="utf-8")
        self.lost = LostLines(f"error log {path}", "error", _to_stderr)

    def close(self) -> None:
        try:
            super().close()
        except OSError:
            pass  # lines a full disk left in the buffer: counted when they failed


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
        if isinstance(old, (logging.FileHandler, *_syslog_handler_types())):
            try:
                old.close()
            except OSError:
                pass  # lines it could not write (a full disk): counted when they failed
    handler: logging.Handler
    if config.error_logfile in ("-", ""):
        handler = ErrorLogStream(sys.stderr)
    else:
        try:
            handler = ErrorLogFile(config.error_logfile)
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
    from logging.handlers import SysLogHandler  # here: only --log-syslog needs it (pickle, queue)

    class ErrorLogSyslog(_CountsLostLines, SysLogHandler):
        """The error log sent to syslog too (`--log-syslog`)."""

        def __init__(self, address: str | tuple[str, int], facility: int, socktype: socket.SocketKind,
                     where: str) -> None:  # fmt: skip
            super().__init__(address, facility, socktype)
            self.lost = LostLines(f"syslog {where}", "error", _to_stderr)

    try:
        facility = SysLogHandler.facility_names[config.syslog_facility]
        handler = ErrorLogSyslog(address, facility, socktype, config.syslog_addr)
    except OSError as e:
        raise ConfigError(f"--log-syslog-to {config.syslog_addr}: {e.strerror or e}") from None
    name = f"refork.{config.syslog_prefix}" if config.syslog_prefix else config.proc_name
    handler.setFormatter(logging.Formatter(f"{name}: [%(process)d] [%(levelname)s] %(message)s"))
    return handler


def _syslog_handler_types() -> tuple[type[logging.Handler], ...]:
    """SysLogHandler if logging.handlers was imported (by --log-syslog or the user's logging config):
    a process that never imported it has none to close."""
    handlers = sys.modules.get("logging.handlers")
    return (handlers.SysLogHandler,) if handlers is not None else ()


def _user_logging(config: Config, logger: logging.Logger) -> None:
    """logconfig_dict (first), else logconfig_json, else logconfig (fileConfig), as gunicorn."""
    if not (config.logconfig_dict or config.logconfig_json or config.logconfig):
        return
    import logging.config  # here: without a logging config, no process needs it (its pickle, socketserver)

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
    """USR1 (logrotate): reopen the error log file and every access log file, in append mode.

    Never raises: a file that cannot be opened (its directory gone, no permission) keeps the one
    it had open, says so in one line, and is tried again at the next USR1 (as nginx does)."""
    for handler in logging.getLogger("refork").handlers:
        if isinstance(handler, logging.FileHandler):
            _reopen_handler(handler)
    for access_log in list(_open_access_logs):
        access_log.reopen()


def _reopen_handler(handler: logging.FileHandler) -> None:
    """Swap a file handler's stream for a new one on its path; the old stream's unwritten lines
    (a full disk) are dropped with it."""
    try:
        new = handler._open()
    except OSError as e:
        log.warning("error log %s: cannot reopen (%s); writing on to the file it had open; tried "
                    "again at the next USR1", handler.baseFilename, _errno_text(e))  # fmt: skip
        return
    handler.acquire()  # an RLock
    try:
        old, handler.stream = handler.stream, new
    finally:
        handler.release()
    if old is not None:
        try:
            old.close()
        except OSError:
            pass  # its buffered lines: counted as lost when they failed


def _close(file: io.FileIO) -> None:
    try:
        file.close()
    except OSError:
        pass  # close(2) reporting an earlier write's failure: those lines were counted then


class AccessLog:
    """One line per response, in a format of refork.log_format (gunicorn's atoms, or common,
    combined, json), each one write(2) to an unbuffered file under a lock."""

    def __init__(self, path: str, fmt: str = GUNICORN_DEFAULT, asgi: bool = False,
                 static: tuple[bytes, ...] = ()) -> None:  # fmt: skip
        self.path = path
        self.format = fmt
        self.line = compile_format(fmt, asgi, static)  # static: the --static mounts' prefixes
        self._lock = threading.RLock()
        self.lost = LostLines(f"access log {path}", "access", log.warning)
        self._file: io.FileIO | None = None  # None: the path is "-" (stdout), or the open failed
        self._open_error = OSError(0, "not open")  # why _file is None
        if path != "-":
            try:
                self._file = self._open()
            except OSError as e:  # a worker starting while the directory is gone: it serves all the same
                self._open_error = e
                log.warning("access log %s: cannot open (%s); its lines are lost until a USR1 "
                            "opens it", path, _errno_text(e))  # fmt: skip
        _open_access_logs.add(self)

    @classmethod
    def from_config(cls, config: Config, asgi: bool = False) -> AccessLog | None:
        """None when the access log is off (config.access_logfile is None); `asgi`: for the ASGI
        loop (see refork.log_format.compile_format)."""
        if config.access_logfile is None:
            return None
        prefixes = tuple(spec.partition("=")[0].encode("latin-1") for spec in config.static)
        return cls(config.access_logfile, config.access_log_format, asgi, prefixes)

    def _open(self) -> io.FileIO:
        return io.FileIO(self.path, "a")  # unbuffered: a line is one write(2), nothing left to flush

    def reopen(self) -> None:
        """Open the file again (after logrotate moved it); stdout is left as is. A file that cannot
        be opened keeps the one open before (one line says so; the next USR1 tries again)."""
        if self.path == "-":
            return
        try:
            new = self._open()
        except OSError as e:
            self._open_error = e
            where = "its lines are lost" if self._file is None else "writing on to the file it had open"
            log.warning("access log %s: cannot reopen (%s); %s; tried again at the next USR1",
                        self.path, _errno_text(e), where)  # fmt: skip
            return
        with self._lock:
            old, self._file = self._file, new
        if old is not None:
            _close(old)

    def close(self) -> None:
        _open_access_logs.discard(self)
        with self._lock:
            if self._file is not None:
                _close(self._file)
                self._file = None

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
        """Write the line of one response (see refork.log_format for the arguments); a line that
        cannot be written is counted in `lost` (and told), never raised."""
        line = self.line(request, remote, status, length, duration, environ, response_headers) + "\n"
        with self._lock:
            try:
                if self.path == "-":
                    sys.stdout.write(line)
                    sys.stdout.flush()
                elif self._file is None:
                    self.lost.failed(self._open_error)
                    return
                else:
                    data = line.encode("utf-8", "backslashreplace")
                    while data:  # one write(2) but after a signal or on a nearly full disk
                        data = data[self._file.write(data) :]
            except OSError as e:
                self.lost.failed(e)
                return
            if self.lost.pending:
                self.lost.written()

    def __repr__(self) -> str:
        return f"AccessLog({self.path!r}, {self.format!r})"
