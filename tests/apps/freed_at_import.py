"""An app whose import allocates GARBAGE bytes through malloc and frees them, keeping a small live
heap allocated after them: the freed memory sits below a live block, where neither glibc's
automatic trim (it releases only the free top of the heap) nor jemalloc's decay (no background
thread, and an idle mold allocates nothing to drive it) returns it to the OS.

- `/`: "BASELINE PID": the RSS in bytes of the process before the import allocated anything (what a
  worker should stay near, plus the server's own modules imported after the app), and the pid
- `/litter`: the same in the worker that serves it (what a promoted mold then holds), then as `/`
"""

from __future__ import annotations

import os
from typing import Any

GARBAGE = 256 << 20
_STRING = 8192  # over pymalloc's 512 bytes: each string is a malloc'd block, in the heap under
# glibc's mmap threshold, in jemalloc's small size classes


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def litter() -> list[bytes]:
    """Allocate GARBAGE bytes, then a little that stays live above them; drop the garbage.

    Dicts of strings, as parsed data or a load-time cache would be; their cycles make them garbage
    only for the collector, which in a mold (importing with GC off) runs just before the fork.
    """
    rows: list[dict[str, Any]] = []
    for i in range(GARBAGE // _STRING):
        row: dict[str, Any] = {"text": f"{i:08d}" * (_STRING // 8)}
        row["self"] = row
        rows.append(row)
    return [f"kept {i}".encode() * 100 for i in range(100)]


BASELINE = _rss()
KEPT = [litter()]


def _body(path: str) -> bytes:
    if path == "/litter":
        KEPT.append(litter())
    return f"{BASELINE} {os.getpid()}".encode()


def wsgi(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    body = _body(environ["PATH_INFO"])
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


async def asgi(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = _body(scope["path"])
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
