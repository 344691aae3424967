"""Static mounts (--static PREFIX=DIR): which file a request names, and the whole answer to it.

:meth:`StaticFiles.answer` takes a method, the raw request target and the request headers and
returns an :class:`Answer` (status, headers, a body or an open file span), or None when the
target is under no mount (the app's). No I/O but stat, open and the read of a small file, which is
then kept (SMALL, HELD) with the metadata, both checked against one stat per request.

Safe by construction: the path is decoded once and refused (403) when it holds ``..``/``.``
segments, an encoded ``/`` or ``\\``, a backslash, a NUL, an empty segment or a dotfile, or when
its real path leaves the mount (a symlink out); a directory or anything but a regular file is a
404. No refusal names the path.

What a file's answer carries is what WhiteNoise and nginx send: MIME type, ETag, Last-Modified,
304 for If-None-Match / If-Modified-Since, one byte range (206 / 416, If-Range), a precompressed
``.br`` / ``.gz`` sibling chosen by Accept-Encoding (with ``Vary``), and a year-long immutable
Cache-Control for a content-hashed name (``app.0123456789ab.css``, ``index-Dx3k9_aZ.js``).
"""

from __future__ import annotations

import mimetypes
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from typing import IO
from urllib.parse import unquote_to_bytes

IMMUTABLE = b"public, max-age=31536000, immutable"
CACHE_SIZE = 4096  # files whose metadata is kept; the cache starts over when full
SMALL = 32 * 1024  # a file up to this size is kept in memory, sent from there (no open per request)
HELD = 8 * 1024 * 1024  # the bytes of small files one worker keeps, at most
ENCODINGS = (("br", b".br"), ("gzip", b".gz"))  # precompressed siblings, in order of preference
ALLOW = b"GET, HEAD"
_HEX_HASH = re.compile(r"[0-9a-f]{8,}")
_B64_HASH = re.compile(r"[A-Za-z0-9_-]{8,}")
_REFUSED = {403: b"403 Forbidden\n", 404: b"404 Not Found\n", 405: b"405 Method Not Allowed\n",
            416: b"416 Range Not Satisfiable\n"}  # fmt: skip
_TEXT = b"text/plain; charset=utf-8"


def content_hashed(name: str) -> bool:
    """Whether a file name carries a content hash: Django's ``name.<12 hex>.ext``, webpack's
    ``name.<hex>.ext`` (8+ hex with a letter), Vite's ``name-<base64url>.ext`` (8+ characters with
    a digit or ``_``/``-`` and a letter; a word such as ``-Settings`` is not a hash)."""
    parts = name.split(".")
    if len(parts) < 2:
        return False
    candidates = parts[1:-1]
    head, dash, tail = parts[0].rpartition("-")
    if dash and head:
        candidates.append(tail)
    for c in candidates:
        if _HEX_HASH.fullmatch(c) and not c.isdigit():
            return True
        if (
            _B64_HASH.fullmatch(c)
            and any(ch.isalpha() for ch in c)
            and any(ch.isdigit() or ch in "_-" for ch in c)
        ):
            return True
    return False


@dataclass(frozen=True)
class Mount:
    """One --static mount: the URL prefix (no trailing slash) and the directory's real path."""

    prefix: bytes
    root: bytes

    @classmethod
    def parse(cls, spec: str, base: str = ".", check: bool = True) -> Mount:
        """``/static=DIR`` (DIR relative to `base`); ValueError when DIR is not a directory (a
        worker's mount whose directory went away after start answers 404s: check=False)."""
        prefix, _, directory = spec.partition("=")
        root = os.path.realpath(os.path.join(base, directory))
        if check and not os.path.isdir(root):
            raise ValueError(f"--static {spec}: {directory!r} is not a directory")
        return cls(prefix.rstrip("/").encode("latin-1"), os.fsencode(root))


@dataclass(slots=True)
class Variant:
    """One representation of a file: itself or a precompressed sibling."""

    path: bytes
    encoding: str | None
    size: int
    key: tuple[int, int, int, int]  # (dev, ino, size, mtime_ns): what an open file must still be
    etag: bytes
    data: bytes | None = None  # a small file's bytes, read once (no open per request)


@dataclass(slots=True)
class Entry:
    """What is known of one file (its stat key tells when it changed)."""

    key: tuple[int, int, int, int]
    content_type: bytes
    last_modified: bytes
    mtime: int
    cache_control: bytes
    variants: list[Variant]  # the file itself first
    vary: bool  # a sibling exists: the answer depends on Accept-Encoding


@dataclass(slots=True)
class Answer:
    """A static response: send `head` fields, then `body` or `count` bytes of `file` from `offset`."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    file: IO[bytes] | None = None
    offset: int = 0
    count: int = 0
    length: int = field(init=False)  # the Content-Length
    # a whole file's 200: the files it stands on, [(path, stat key)] (the file, then the sibling
    # sent), and the path its body is read from (refork.serving.static_apps records it)
    source: list[tuple[bytes, tuple[int, int, int, int]]] = field(default_factory=list)
    path: bytes = b""

    def __post_init__(self) -> None:
        self.length = self.count if self.file is not None else len(self.body)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _refused(status: int, headers: Sequence[tuple[bytes, bytes]] = ()) -> Answer:
    return Answer(status, [(b"content-type", _TEXT), *headers], _REFUSED[status])


class StaticFiles:
    """The mounts of one worker, and the metadata cache of the files they served."""

    def __init__(self, mounts: Sequence[Mount], max_age: int = 60, follow_symlinks: bool = False,
                 cache_size: int = CACHE_SIZE) -> None:  # fmt: skip
        # the longest prefix first, so /static/admin=... wins over /static=...
        self.mounts = sorted(mounts, key=lambda m: len(m.prefix), reverse=True)
        self.cache_control = b"public, max-age=%d" % max_age
        self.follow_symlinks = follow_symlinks
        self.cache_size = cache_size
        self.cache: dict[bytes, Entry] = {}
        self.held = 0  # bytes of small files in the cache's entries
        if not mimetypes.inited:  # the system's tables read now, not on the first request (once:
            mimetypes.init()  # init() again would drop the app's own add_type())

    def mount_of(self, path: bytes) -> Mount | None:
        """The mount a raw path (no query) falls under: PREFIX itself or PREFIX/..."""
        for m in self.mounts:
            if path.startswith(m.prefix) and (len(path) == len(m.prefix) or path[len(m.prefix)] == 47):
                return m
        return None

    def answer(self, method: str, target: bytes, headers: Mapping[str, str]) -> Answer | None:
        """The answer to a request (`headers`: lower-case names), or None when no mount has it.
        An answer with a file owns it: the caller sends it and calls close()."""
        path = target.partition(b"?")[0]
        mount = self.mount_of(path)
        if mount is None:
            return None
        if method not in ("GET", "HEAD"):
            return _refused(405, [(b"allow", ALLOW)])
        file = self._resolve(mount, path[len(mount.prefix) :])
        if isinstance(file, int):
            return _refused(file)
        try:
            st = os.stat(file)
        except (OSError, ValueError):
            return _refused(404)
        if not stat.S_ISREG(st.st_mode):
            return _refused(404)
        for _ in range(2):  # a file replaced between the stat and the open: once more
            entry = self._entry(mount, file, st)
            if isinstance(entry, int):
                return _refused(entry)
            answer = self._respond(method, entry, headers)
            if answer is not None:
                return answer
            self._forget(file)
            try:
                st = os.stat(file)
            except OSError:
                return _refused(404)
        return _refused(404)

    def _resolve(self, mount: Mount, rest: bytes) -> bytes | int:
        """The file a path below the prefix names, or the refusal's status."""
        if not rest.startswith(b"/") or rest.endswith(b"/"):
            return 404  # the prefix itself, or a directory: never listed
        if b"\\" in rest or b"%00" in rest or b"\x00" in rest:
            return 403
        lowered = rest.lower()
        if b"%2f" in lowered or b"%5c" in lowered:
            return 403  # an encoded separator: a segment must not hold one
        decoded = unquote_to_bytes(rest) if b"%" in rest else rest
        segments = decoded[1:].split(b"/")
        for s in segments:
            if not s or s.startswith(b".") or b"\x00" in s or b"\\" in s:
                return 403  # "", ".", "..", a dotfile (.env, .git)
        return os.path.join(mount.root, *segments)

    def _entry(self, mount: Mount, file: bytes, st: os.stat_result) -> Entry | int:
        key = _key(st)
        entry = self.cache.get(file)
        if entry is not None and entry.key == key:
            return entry
        if not self.follow_symlinks:
            real = os.path.realpath(file)
            if not real.startswith(mount.root + b"/"):
                return 403  # a symlink leading out of the mount
        name = os.fsdecode(os.path.basename(file))
        content_type, _ = mimetypes.guess_type(name, strict=False)
        ctype = (content_type or "application/octet-stream").encode("latin-1")
        if ctype.startswith(b"text/") or ctype in (b"application/javascript", b"application/json"):
            ctype += b"; charset=utf-8"
        variants = [Variant(file, None, st.st_size, key, _etag(st, b""))]
        for encoding, suffix in ENCODINGS:
            try:
                sib = os.stat(file + suffix)
            except OSError:
                continue
            if stat.S_ISREG(sib.st_mode) and sib.st_mtime_ns >= st.st_mtime_ns:  # not stale
                variants.append(Variant(file + suffix, encoding, sib.st_size, _key(sib), _etag(sib, suffix)))
        self._forget(file)
        if len(self.cache) >= self.cache_size:
            self.cache.clear()
            self.held = 0
        for v in variants:
            if v.size <= SMALL and self.held + v.size <= HELD:
                v.data = _read(v)
                self.held += len(v.data or b"")
        entry = Entry(
            key, ctype, formatdate(st.st_mtime, usegmt=True).encode("ascii"), int(st.st_mtime),
            IMMUTABLE if content_hashed(name) else self.cache_control, variants, len(variants) > 1,
        )  # fmt: skip
        self.cache[file] = entry
        return entry

    def _forget(self, file: bytes) -> None:
        """Drop a file's entry (it changed), and the bytes it held."""
        old = self.cache.pop(file, None)
        if old is not None:
            self.held -= sum(len(v.data) for v in old.variants if v.data is not None)

    def _respond(self, method: str, entry: Entry, headers: Mapping[str, str]) -> Answer | None:
        """The answer from the entry; None when the file changed under it (the caller retries)."""
        variant = _variant(entry, headers.get("accept-encoding", ""))
        common = [(b"etag", variant.etag), (b"last-modified", entry.last_modified),
                  (b"cache-control", entry.cache_control)]  # fmt: skip
        if entry.vary:
            common.append((b"vary", b"Accept-Encoding"))
        if _not_modified(variant.etag, entry.mtime, headers):
            return Answer(304, common)
        common.append((b"content-type", entry.content_type))
        if variant.encoding is not None:
            common.append((b"content-encoding", variant.encoding.encode("ascii")))
        common.append((b"accept-ranges", b"bytes"))
        size, status, offset, count = variant.size, 200, 0, variant.size
        wanted = headers.get("range")
        if wanted is not None and _if_range(headers.get("if-range"), variant.etag, entry.mtime):
            span = byte_range(wanted, size)
            if span == "unsatisfiable":
                return _refused(416, [(b"content-range", b"bytes */%d" % size)])
            if isinstance(span, tuple):
                status, offset, count = 206, span[0], span[1] - span[0] + 1
                common.append((b"content-range", b"bytes %d-%d/%d" % (span[0], span[1], size)))
        if method == "HEAD":
            answer = Answer(status, common)
            answer.length = count
        elif variant.data is not None:
            if variant.encoding is not None:  # a sibling is not stat'ed with its file: now
                try:
                    if _key(os.stat(variant.path)) != variant.key:
                        return None
                except OSError:
                    return None
            answer = Answer(status, common, variant.data[offset : offset + count])
        else:
            try:
                f = open(variant.path, "rb", buffering=0)  # noqa: SIM115 - Answer.close()
            except OSError:
                return None
            if _key(os.fstat(f.fileno())) != variant.key:
                f.close()
                return None
            answer = Answer(status, common, file=f, offset=offset, count=count)
        if status == 200:
            main = entry.variants[0]
            answer.source = [(main.path, main.key)]
            if variant is not main:
                answer.source.append((variant.path, variant.key))
            answer.path = variant.path
        return answer


def _read(variant: Variant) -> bytes | None:
    """A small file's bytes, when the file read is still the one stat'ed."""
    try:
        with open(variant.path, "rb", buffering=0) as f:
            if _key(os.fstat(f.fileno())) != variant.key:
                return None
            data = f.read(variant.size + 1)
    except OSError:
        return None
    return data if len(data) == variant.size else None


def _etag(st: os.stat_result, suffix: bytes) -> bytes:
    return b'"%x-%x%s"' % (st.st_mtime_ns // 1000, st.st_size, suffix.replace(b".", b"-"))


def _variant(entry: Entry, accept_encoding: str) -> Variant:
    """The smallest representation the client accepts (q=0 refuses a coding)."""
    if not entry.vary or not accept_encoding:
        return entry.variants[0]
    accepted = set()
    for item in accept_encoding.lower().split(","):
        coding, _, params = item.strip().partition(";")
        q = params.strip()
        if q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"):
            continue
        accepted.add(coding.strip())
    best = entry.variants[0]
    for v in entry.variants[1:]:
        if (v.encoding in accepted or "*" in accepted) and v.size < best.size:
            best = v
    return best


def _not_modified(etag: bytes, mtime: int, headers: Mapping[str, str]) -> bool:
    """RFC 9110 13.2.2: If-None-Match (weak comparison) decides; If-Modified-Since only without it."""
    inm = headers.get("if-none-match")
    if inm is not None:
        if inm.strip() == "*":
            return True
        ours = etag.decode("latin-1")
        return any(t.strip().removeprefix("W/") == ours for t in inm.split(","))
    ims = headers.get("if-modified-since")
    if ims is not None:
        since = _http_date(ims)
        return since is not None and mtime <= since
    return False


def _if_range(value: str | None, etag: bytes, mtime: int) -> bool:
    """Whether a Range applies: no If-Range, or one naming this representation (strong ETag, or
    a date no older than the file)."""
    if value is None:
        return True
    value = value.strip()
    if value.startswith('"'):
        return value == etag.decode("latin-1")
    since = _http_date(value)
    return since is not None and mtime <= since


def _http_date(value: str) -> int | None:
    try:
        return int(parsedate_to_datetime(value).timestamp())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def byte_range(value: str, size: int) -> tuple[int, int] | str | None:
    """One ``bytes=`` range of a `size`-byte file: (first, last), "unsatisfiable", or None to send
    the whole file (no range, a malformed one, or several: RFC 9110 allows ignoring them)."""
    unit, _, spec = value.partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    first, dash, last = spec.strip().partition("-")
    if not dash:
        return None
    first, last = first.strip(), last.strip()
    if not (first.isdigit() or first == "") or not (last.isdigit() or last == "") or first == last == "":
        return None
    if first == "":  # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(0, size - n), size - 1
    start = int(first)
    end = size - 1 if last == "" else int(last)
    if last != "" and end < start:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size - 1)
