"""Request bodies as the app sees them: received in full before the app runs.

Small bodies stay in memory; larger ones are spooled to an anonymous temp file so a big upload
costs disk, not worker RSS. The stream holds exactly the body, so an app can never read into
the next pipelined request, and reads never block on the network.

Spooled files are unlinked at creation (``tempfile.TemporaryFile`` in ``Spool.directory``), so
``du`` does not see them; a worker's :class:`Spool` caps the bytes its connections hold there at
once, so a few clients cannot fill the disk: a body that could never fit is answered 413, one that
does not fit now 503 (with ``Retry-After``).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterator
from typing import BinaryIO

from refork.http.events import ParseError


class Spool:
    """One worker's budget of spooled body bytes in flight, and where they go."""

    __slots__ = ("limit", "directory", "used")

    def __init__(self, limit: int, directory: str | None = None) -> None:
        self.limit = limit or (1 << 62)  # 0: no cap
        self.directory = directory  # None: tempfile's default ($TMPDIR, /tmp, ...)
        self.used = 0

    def take(self, n: int) -> None:
        """Charge n more bytes, or raise ParseError(503) when they do not fit now."""
        if self.used + n > self.limit:
            raise ParseError(503, "request body spool is full")
        self.used += n

    def give_back(self, n: int) -> None:
        self.used -= n


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


class _SpooledInput(InputStream):
    """A body in a temp file: closing it also gives its bytes back to the worker's Spool."""

    __slots__ = ("_spool", "_charged")

    def __init__(self, f: BinaryIO, length: int, spool: Spool, charged: int) -> None:
        super().__init__(f, length)
        self._spool = spool
        self._charged = charged

    def close(self) -> None:
        if self._charged:
            self._spool.give_back(self._charged)
            self._charged = 0
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


_NO_SPOOL = Spool(0)  # for callers without a worker budget (tests, tools)


class BodyBuffer:
    """Collects de-chunked body pieces; spills to a temp file past `threshold` bytes.

    Spilled bytes are charged to `spool`: a declared `length` is charged whole when the body
    spills (an upload that cannot fit is refused before it fills the disk), a chunked body as it
    arrives. write() raises ParseError 413 (bigger than the whole spool) or 503 (no room now).
    """

    __slots__ = ("_parts", "_size", "_file", "_threshold", "_spool", "_length", "_charged")

    def __init__(self, threshold: int, spool: Spool = _NO_SPOOL, length: int | None = None) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._file: BinaryIO | None = None
        self._threshold = threshold
        self._spool = spool
        self._length = length
        self._charged = 0

    def write(self, data: bytes) -> None:
        self._size += len(data)
        if self._file is not None:
            if self._size > self._charged:
                self._charge(self._size - self._charged)
            self._file.write(data)
            return
        self._parts.append(data)
        if self._size > self._threshold:
            self._charge(max(self._size, self._length or 0))
            f = tempfile.TemporaryFile(prefix="refork-body-", dir=self._spool.directory)  # noqa: SIM115 - owned by the stream
            try:
                for part in self._parts:
                    f.write(part)
            except BaseException:
                f.close()
                raise
            self._file = f
            self._parts = []

    def _charge(self, n: int) -> None:
        spool = self._spool
        if self._charged + n > spool.limit:
            raise ParseError(413, "request body larger than the spool (--max-spool)")
        spool.take(n)
        self._charged += n

    def finish(self) -> InputStream:
        """The complete body as a stream positioned at its start (ownership passes to it)."""
        f = self._file
        self._file = None
        if f is not None:
            f.flush()
            f.seek(0)
            charged = self._charged
            self._charged = 0
            return _SpooledInput(f, self._size, self._spool, charged)
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
        if self._charged:
            self._spool.give_back(self._charged)
            self._charged = 0
        self._parts = []
