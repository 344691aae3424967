"""The file of an ``http.response.pathsend`` or ``http.response.zerocopysend`` message (ASGI extensions).

:func:`file_source` checks the message and opens / sizes the file before anything is written, so a
missing path raises (FileNotFoundError) in the app while an error response can still replace the
held-back head. The bytes are framed by :meth:`refork.asgi.response.ResponseState.file_frame` and
sent by the connection (:meth:`refork.asgi.cycle.Channel.send_file`).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class FileSource:
    """Where a file message's bytes come from."""

    fd: int
    offset: int
    count: int
    more_body: bool
    opened: Any = None  # the file pathsend opened: closed by close(); the app owns a zerocopysend file
    advance: bool = False  # zerocopysend without an offset: move the position past what was sent

    def done(self) -> None:
        """The bytes were sent: sendfile(2) semantics for a file sent from its current position."""
        if self.advance:
            os.lseek(self.fd, self.offset + self.count, os.SEEK_SET)

    def close(self) -> None:
        if self.opened is not None:
            self.opened.close()


def file_source(message: dict[str, Any]) -> FileSource:
    """Open (pathsend) or inspect (zerocopysend) the message's file; RuntimeError for a bad message."""
    if message["type"] == "http.response.pathsend":
        path = message.get("path")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise RuntimeError(f"'path' must be an absolute path (str), got {path!r}")
        opened = open(path, "rb", buffering=0)  # noqa: SIM115 - FileSource.close()
        try:
            info = os.fstat(opened.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise IsADirectoryError(f"not a regular file: {path!r}")
        except BaseException:
            opened.close()
            raise
        return FileSource(opened.fileno(), 0, info.st_size, False, opened)
    try:
        fd = message["file"].fileno()
    except (KeyError, AttributeError, ValueError, OSError) as exc:
        raise RuntimeError(f"'file' must be an open file with a descriptor: {exc!r}") from None
    offset, count = message.get("offset"), message.get("count")
    advance = offset is None
    if offset is None:
        offset = os.lseek(fd, 0, os.SEEK_CUR)
    for value in (offset, count):
        if value is not None and (type(value) is not int or value < 0):
            raise RuntimeError(f"'offset' and 'count' must be non-negative ints, got {offset!r}, {count!r}")
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode):
        available = max(0, info.st_size - offset)
        count = available if count is None else min(count, available)
    elif count is None:
        raise RuntimeError("'count' is required to send a file that is not a regular file")
    return FileSource(fd, offset, count, bool(message.get("more_body", False)), None, advance)
