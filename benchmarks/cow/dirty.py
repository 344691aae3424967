"""Which pages of the mold's heap a worker copies, and what lives on them.

Run it with a benchmark venv's interpreter, from benchmarks/:

    benchmarks/.venv-3.14/bin/python benchmarks/cow/dirty.py [--warm 0] [--requests 1250]

As refork's mold does, it imports the generated monolith (make_monolith.py) with the GC
disabled, optionally serves --warm requests itself, prepares the heap (lazy imports, collect,
immortalize, freeze) and records the physical page behind every present page of its private
writable mappings (/proc/self/pagemap; needs root). A forked child then serves --requests
requests (the benchmark's paths, called on the WSGI app directly: no sockets), and compares:
a page present in both whose physical page changed was copied on write. The child then walks
the heap and names the objects that start on each copied page.

Output: copied MiB per mapping, then per kind of object (a page is split evenly among the
objects that start on it; "no object starts here" is allocator state, the tail of a larger
object, or memory that is not a Python object, such as dict keys or list item arrays), with
the number of pages on which such objects start and how many of them were copied.

--owned reports instead every page of the child's writable private mappings that only it maps
(pagemap's "exclusively mapped" bit: copied or allocated since the fork, its USS there), the
same way; code objects and functions named __annotate__ (3.14+) are counted apart.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: pagemap
from pagemap import (  # noqa: E402
    PAGE,
    copied_report,
    exclusive_pages,
    present_pages,
    writable_private_mappings,
)

BENCH_DIR = Path(__file__).resolve().parent.parent


def environ(path: str) -> dict:
    return {"REQUEST_METHOD": "GET", "PATH_INFO": path, "SERVER_NAME": "x", "SERVER_PORT": "80",
            "wsgi.url_scheme": "http", "QUERY_STRING": ""}


def serve(app, paths: list[str], count: int) -> None:
    for i in range(count):
        b"".join(app(environ(paths[i % len(paths)]), lambda status, headers, exc=None: None))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--monolith", default="monolith_generated")
    parser.add_argument("--warm", type=int, default=0, help="requests the mold serves before the fork")
    parser.add_argument("--requests", type=int, default=1250, help="requests the child serves")
    parser.add_argument("--no-immortalize", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--owned", action="store_true",
                        help="report every page only the child maps (copied or new: its USS in the "
                        "writable private mappings) instead of the copied ones")
    args = parser.parse_args()

    gc.disable()
    sys.path.insert(0, str(BENCH_DIR))
    from refork.memory.heap import prepare_heap_for_fork

    app = __import__(f"{args.monolith}.app", fromlist=["app"]).app
    paths = [f"/w/{i}" for i in range(20)] + [f"/r/{i}" for i in range(300)]
    serve(app, paths, args.warm)
    report = prepare_heap_for_fork(immortalize=not args.no_immortalize)
    print(f"Python {sys.version.split()[0]}: {report.describe()}", flush=True)
    maps = writable_private_mappings()
    before = present_pages(maps)
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        with os.fdopen(r) as pipe:
            print(pipe.read(), end="")
        os.waitpid(pid, 0)
        return
    os.close(r)
    gc.enable()
    start = time.perf_counter()
    serve(app, paths, args.requests)
    seconds = time.perf_counter() - start
    if args.owned:  # before the probe allocates its own page tables
        rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
        uss = sum(int(line.split()[1]) for line in rollup
                  if line.startswith(("Private_Clean:", "Private_Dirty:")))
        maps = writable_private_mappings()
        owned = exclusive_pages(maps)
        lines = [f"child served {args.requests} requests in {seconds:.1f} s; its USS {uss / 1024:.1f} MiB, "
                 f"{len(owned) * PAGE / 2**20:.1f} MiB of it in writable private pages"]
        lines += copied_report(owned, maps, args.top, what="owned")
    else:
        after = present_pages(maps)
        copied = {page for page, frame in before.items() if after.get(page, frame) != frame}
        lines = [f"child served {args.requests} requests in {seconds:.1f} s; "
                 f"{len(copied) * PAGE / 2**20:.1f} MiB of the mold's pages copied"]
        lines += copied_report(copied, maps, args.top)
    os.write(w, ("\n".join(lines) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
