"""Request bodies as the app sees them: received in full before the app runs.

Small bodies stay in memory; larger ones are spooled to an anonymous temp file so a big upload
costs disk, not worker RSS. The stream holds exactly the body, so an app can never read into
the next pipelined request, and reads never block on the network.

Spooled files are unlinked at creation (``tempfile.TemporaryFile`` in ``Spool.directory``), so
``du`` does not see them; a worker's :class:`Spool` caps the bytes its connections hold there at
once, so a few clients cannot fill the disk: a body that could never fit is answered 413, one that
does not fit now 503 (with ``Retry-After``). What a body holds of the budget is what has arrived
of it, never what its header declares: a client that declares a gigabyte and sends a megabyte
holds a megabyte. A spool directory that is full (or over a quota) is a 507, with
``Retry-After``, to the upload that found it so.

A spool file is written unbuffered, as the body arrives: a buffered one would keep up to its
buffer (128 KiB from Python 3.14) of every body in the worker's memory until the body ends, under
no budget. The app reads the finished body through a buffer.
"""

from __future__ import annotations

import errno
import io
import tempfile
from collections.abc import Iterator
from typing import Any, BinaryIO

from refork.http.budget import MemoryBudget
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


# What a write to a spool file that cannot take more raises: the disk or the user's quota is
# full, or the file would pass the process's size limit.
_DISK_FULL = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EFBIG))


def _disk_full(exc: OSError) -> ParseError:
    if exc.errno in _DISK_FULL:
        return ParseError(507, "no space left in the spool directory for the request body")
    return ParseError(500, f"cannot spool the request body: {exc.strerror or exc}")


def _write(f: io.FileIO, data: bytes) -> None:
    """All of data to an unbuffered file (a raw write may take less than it was given)."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:  # (a regular file takes something or raises; nothing at all: it is full)
            raise OSError(errno.ENOSPC, "the spool file takes no more")
        view = view[n:]


class BodyBuffer:
    """Collects de-chunked body pieces; spills to a temp file past `threshold` bytes.

    Bytes held in memory are charged to `memory` (the worker's --max-request-memory) as they
    arrive; when it is full the body spills at once, whatever its size. Spilled bytes are charged
    to `spool` as they arrive. When the body spills, a declared `length`
    that could never fit is refused at once (413), and one that does not fit beside the bytes the
    other uploads hold now gets a 503 before it fills the disk; a body then never holds more of the
    budget than what has arrived of it (a declared length reserves nothing). write() and finish()
    raise ParseError 413, 503, or 507 when the spool directory is full (500 if it fails otherwise).
    """

    __slots__ = (
        "_parts", "_size", "_file", "_threshold", "_spool", "_length", "_charged", "_memory", "_in_memory",
    )  # fmt: skip

    def __init__(
        self, threshold: int, spool: Spool = _NO_SPOOL, length: int | None = None, memory: Any = None
    ) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._file: io.FileIO | None = None  # unbuffered: the bytes that arrived are on disk
        self._threshold = threshold
        self._spool = spool
        self._length = length
        self._charged = 0
        self._memory: MemoryBudget | None = memory  # the worker's: a body past it is spooled sooner
        self._in_memory = 0  # bytes of _parts charged to it

    def write(self, data: bytes) -> None:
        self._size += len(data)
        if self._file is not None:
            self._charge(self._size - self._charged)
            try:
                _write(self._file, data)
            except OSError as exc:
                raise _disk_full(exc) from None
            return
        self._parts.append(data)
        memory = self._memory
        if self._size > self._threshold:
            self._spill()
        elif memory is not None:
            if memory.take(len(data)):
                self._in_memory += len(data)
            else:  # the worker holds enough bodies in memory: this one goes to disk now
                self._spill()

    def _spill(self) -> None:
        """Move the parts to a temp file: the declared length is checked, what arrived charged."""
        spool = self._spool
        length = max(self._size, self._length or 0)
        if length > spool.limit:
            raise ParseError(413, "request body larger than the spool (--max-spool)")
        if spool.used + length > spool.limit:
            raise ParseError(503, "request body spool is full")
        self._charge(self._size)
        try:
            f = tempfile.TemporaryFile(buffering=0, prefix="refork-body-", dir=spool.directory)  # noqa: SIM115 - owned by the stream
        except OSError as exc:
            raise _disk_full(exc) from None
        try:
            for part in self._parts:
                _write(f, part)
        except BaseException as exc:
            f.close()
            if isinstance(exc, OSError):
                raise _disk_full(exc) from None
            raise
        self._file = f
        self._parts = []
        self._let_go()

    def _let_go(self) -> None:
        """The parts are no longer this buffer's to hold in memory: give their bytes back."""
        if self._in_memory:
            self._memory.give_back(self._in_memory)  # type: ignore[union-attr]
            self._in_memory = 0

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
            try:
                f.seek(0)
            except OSError as exc:
                self._file = f  # discard() closes it and gives its bytes back
                raise _disk_full(exc) from None
            charged = self._charged
            self._charged = 0
            return _SpooledInput(io.BufferedReader(f), self._size, self._spool, charged)
        parts = self._parts
        self._parts = []
        self._let_go()  # (the app's now, no longer arriving)
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
        self._let_go()
