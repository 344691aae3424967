"""``wsgi.file_wrapper``, and what sendfile() needs to know about the file it wraps."""

from __future__ import annotations

import io
import os
import stat
from typing import Any


class FileWrapper:
    """``wsgi.file_wrapper``: the loop sends it with sendfile() when it can, else in blocks."""

    def __init__(self, filelike: Any, blksize: int = 1 << 16) -> None:
        self.filelike = filelike
        self.blksize = blksize
        if hasattr(filelike, "close"):
            self.close = filelike.close

    def __iter__(self) -> FileWrapper:
        return self

    def __next__(self) -> bytes:
        data: bytes = self.filelike.read(self.blksize)
        if data:
            return data
        raise StopIteration


def file_span(filelike: Any) -> tuple[int, int, int] | None:
    """(fd, offset, bytes to the end) when the object is a binary regular file: what sendfile needs."""
    if isinstance(filelike, io.TextIOBase):
        return None
    try:
        fd = filelike.fileno()
        offset = filelike.tell()
        if not isinstance(fd, int) or fd < 0:
            return None
        st = os.fstat(fd)
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return fd, offset, max(st.st_size - offset, 0)
