"""Request bodies as the app sees them: received in full before the app runs.

Small bodies stay in memory; larger ones are spooled to an anonymous temp file so a big upload
costs disk, not worker RSS. The stream holds exactly the body, so an app can never read into
the next pipelined request, and reads never block on the network.
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from typing import BinaryIO


class InputStream:
    """``wsgi.input``: read / readline / readlines / iteration over a complete body."""

    __slots__ = ("_f", "length")

    def __init__(self, f: BinaryIO, length: int) -> None:
        self._f = f
        self.length = length

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self._f.read()
        return self._f.read(size)

    def readline(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self._f.readline()
        return self._f.readline(size)

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        if hint is None or hint <= 0:
            return self._f.readlines()
        return self._f.readlines(hint)

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        line = self._f.readline()
        if not line:
            raise StopIteration
        return line

    def close(self) -> None:
        """Release the buffer or temp file; the server calls this after the response."""
        self._f.close()


class _EmptyInput(InputStream):
    """One shared stream for the (very common) requests without a body."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(io.BytesIO(b""), 0)

    def read(self, size: int | None = -1) -> bytes:
        return b""

    def readline(self, size: int | None = -1) -> bytes:
        return b""

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        return []

    def __next__(self) -> bytes:
        raise StopIteration

    def close(self) -> None:
        pass


EMPTY_INPUT: InputStream = _EmptyInput()


class BodyBuffer:
    """Collects de-chunked body pieces; spills to a temp file past `threshold` bytes."""

    __slots__ = ("_parts", "_size", "_file", "_threshold")

    def __init__(self, threshold: int) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._file: BinaryIO | None = None
        self._threshold = threshold

    def write(self, data: bytes) -> None:
        self._size += len(data)
        if self._file is not None:
            self._file.write(data)
            return
        self._parts.append(data)
        if self._size > self._threshold:
            f = tempfile.TemporaryFile(prefix="refork-body-")  # noqa: SIM115 - owned by the stream
            try:
                for part in self._parts:
                    f.write(part)
            except BaseException:
                f.close()
                raise
            self._file = f
            self._parts = []

    def finish(self) -> InputStream:
        """The complete body as a stream positioned at its start (ownership passes to it)."""
        f = self._file
        self._file = None
        if f is not None:
            f.flush()
            f.seek(0)
            return InputStream(f, self._size)
        parts = self._parts
        self._parts = []
        if not parts:
            return EMPTY_INPUT
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return InputStream(io.BytesIO(data), self._size)

    def discard(self) -> None:
        """Drop what was received (connection closed mid-body)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._parts = []
