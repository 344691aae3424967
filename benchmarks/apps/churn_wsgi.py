"""Allocation-heavy WSGI app for the memory-creep soak (benchmarks/memory_creep.py).

The pattern that fragments glibc's heaps, from a typical JSON service: every request allocates
short-lived garbage of mixed sizes (JSON parsed and built, lists and dicts grown and shrunk,
byte buffers), while a bounded LRU cache keeps a changing set of long-lived survivors of mixed
sizes scattered between that garbage. Run it with several threads per worker so that glibc hands
each thread its own arena. Now and then a request builds a large transient buffer (a "report"):
once glibc frees such a block from mmap it raises its mmap threshold, and later large blocks
come from the arenas instead, where a small cached survivor allocated after them pins the heap
above them. Python's own allocator (pymalloc) serves only objects of 512 bytes or less; all the
larger ones go to malloc, which is what --allocator and --malloc-trim change.

Rare exports of heavy-tailed size (the wrk mix sends one in 2,000 requests, mostly 1-2 MiB,
sometimes tens) raise a glibc arena to a new high-water mark; glibc gives back only what is
free at the top of an arena, so the freed middle stays resident, and with one arena per thread
each arena ratchets up on its own. That is the creep: the live set is constant (the cache is
bounded), RSS keeps stepping up. jemalloc returns freed dirty pages after its decay time.

Endpoints (the wrk script in memory_creep.py varies them):
  POST /ingest          a JSON document: parsed, transformed, a derived value cached
  GET  /report?rows=N   builds N rows of mixed-width records, serializes them, caches a slice
  GET  /blob?kb=N       a byte buffer of N KiB, checksummed, a copy of a slice cached
  GET  /export?mb=X     a rare bulk export: X MiB of 1-6 KiB records alive at once (heavy-tailed X)
  GET  /stats           the cache's entry count and byte estimate (for the log)

The work is deterministic given the request, except for the cache keys and sizes, drawn from a
per-thread random generator seeded from the request counter: equal load gives every variant
the same distribution, not the same sequence.
"""

from __future__ import annotations

import json
import random
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from urllib.parse import parse_qs

CACHE_ENTRIES = 2000  # bounded: the live set stays constant once the cache is full
KEY_SPACE = 6000
MIB = 1 << 20  # keys drawn from a space larger than the cache: entries churn and survive at random

_cache: OrderedDict[str, object] = OrderedDict()
_cache_bytes = 0
_lock = threading.Lock()
_local = threading.local()
_counter = 0


def _rng() -> random.Random:
    r: random.Random | None = getattr(_local, "rng", None)
    if r is None:
        global _counter
        with _lock:
            _counter += 1
            seed = _counter
        r = _local.rng = random.Random(seed * 7919)
    return r


def _survivor_size(r: random.Random) -> int:
    """Mostly small, a quarter medium, a few up to 64 KiB: all above pymalloc's 512-byte limit."""
    x = r.random()
    if x < 0.70:
        return r.randint(520, 2048)
    if x < 0.95:
        return r.randint(2048, 16384)
    return r.randint(16384, 65536)


def _remember(key: str, value: object, size: int) -> None:
    global _cache_bytes
    with _lock:
        old = _cache.pop(key, None)
        if old is not None:
            _cache_bytes -= _approx(old)
        _cache[key] = value
        _cache_bytes += size
        while len(_cache) > CACHE_ENTRIES:
            _, dropped = _cache.popitem(last=False)
            _cache_bytes -= _approx(dropped)


def _approx(value: object) -> int:
    if isinstance(value, (bytes, str)):
        return len(value)
    return 0


def _touch(r: random.Random) -> None:
    """A cache read: keeps recently used entries alive (LRU), so survival times vary."""
    key = f"k{r.randrange(KEY_SPACE)}"
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)


def _ingest(body: bytes, r: random.Random) -> dict[str, object]:
    doc = json.loads(body) if body else {}
    items = doc.get("items", []) if isinstance(doc, dict) else []
    # Grow a list of dicts, then shrink it: garbage of mixed sizes.
    rows = [
        {**item, "seen": i, "tags": [str(t) * (1 + i % 5) for t in item.get("tags", [])]}
        for i, item in enumerate(items)
    ]
    rows.sort(key=lambda row: str(row.get("name", "")))
    del rows[len(rows) // 2 :]
    index = {str(row.get("name")): row for row in rows}
    size = _survivor_size(r)
    _remember(f"k{r.randrange(KEY_SPACE)}", json.dumps(rows)[:size].ljust(size, " "), size)
    _touch(r)
    return {"received": len(items), "kept": len(index)}


def _report(rows: int, r: random.Random) -> dict[str, object]:
    records = []
    for i in range(rows):
        width = r.choice((8, 40, 200, 700, 2000))
        records.append({"id": i, "name": "n" * width, "values": list(range(i % 50)), "ok": bool(i & 1)})
    text = json.dumps(records)
    parsed = json.loads(text)
    del parsed[::2]
    size = _survivor_size(r)
    _remember(f"k{r.randrange(KEY_SPACE)}", text[:size], size)
    _touch(r)
    return {"rows": rows, "bytes": len(text)}


def _blob(kib: int, r: random.Random) -> dict[str, object]:
    data = r.randbytes(kib * 1024)
    parts = [data[i : i + 4096] for i in range(0, len(data), 4096)]
    checksum = zlib.crc32(b"".join(reversed(parts)))
    size = min(_survivor_size(r), len(data))
    _remember(f"k{r.randrange(KEY_SPACE)}", bytes(data[:size]), size)
    _touch(r)
    return {"kib": kib, "crc": checksum}


def _export(mib: float, r: random.Random) -> dict[str, object]:
    """A rare bulk export: `mib` MiB of 1-6 KiB records, all alive at once, then dropped.

    Each record is its own malloc (over pymalloc's limit, under glibc's mmap threshold), so the
    whole export lands in this thread's arena and grows it; the cache entry stored at the end is
    allocated while the arena is at its largest and can pin its top.
    """
    records: list[str] = []
    total = 0
    while total < mib * MIB:
        n = r.randint(1024, 6144)
        records.append(f"{len(records):08d}," + "r" * n)
        total += n
    records.sort(key=len)
    digest = zlib.crc32(records[-1].encode())
    size = _survivor_size(r)
    _remember(f"k{r.randrange(KEY_SPACE)}", records[len(records) // 2][:size], size)
    return {"records": len(records), "bytes": total, "crc": digest}


def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
    r = _rng()
    path = environ.get("PATH_INFO", "/")
    query = parse_qs(environ.get("QUERY_STRING", ""))
    if path == "/ingest":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        result = _ingest(environ["wsgi.input"].read(length), r)
    elif path == "/report":
        result = _report(int(query.get("rows", ["100"])[0]), r)
    elif path == "/blob":
        result = _blob(int(query.get("kb", ["64"])[0]), r)
    elif path == "/export":
        result = _export(float(query.get("mb", ["1"])[0]), r)
    elif path == "/stats":
        with _lock:
            result = {"entries": len(_cache), "bytes": _cache_bytes}
    else:
        result = {"ok": True}
    body = json.dumps(result).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
