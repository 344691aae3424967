"""Which of the mold's pages a worker of the Wagtail site copies, and what lives on them.

Run it as root (it reads /proc/self/pagemap) with the site's venv, after prepare.py:

    benchmarks/real_django/.venv-3.12/bin/python benchmarks/real_django/dirty.py [--warm 0] [--requests 600]

As refork's mold does, it imports the site with the GC disabled, optionally serves --warm requests
itself (a mold promoted from a worker that served them), prepares the heap (collect, immortalize,
freeze) and records the physical page behind every present page of its private writable mappings.
A forked child then serves --requests requests of the benchmark's mixed load (run.py's sequence,
the admin ones with a logged-in session; called on the WSGI app directly, no sockets) and
compares: a page present in both whose physical page changed was copied on write. The child then
walks the heap and names the objects that start on each copied page (a page is split evenly among
them; "no object starts here" is allocator state, the tail of a larger object, or memory that is
no Python object: dict keys, list item arrays, string data). --owned accounts instead for every
page only the child maps (copied or new), as cow/dirty.py --owned does.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/: pagemap
from pagemap import (  # noqa: E402
    PAGE,
    copied_report,
    exclusive_pages,
    present_pages,
    writable_private_mappings,
)


def serve(app: Callable, paths: list[str], cookie: str) -> Counter[int]:
    """Each path through the WSGI app, as a logged-in browser sends it; the statuses."""
    statuses: Counter[int] = Counter()
    for full in paths:
        path, _, query = full.partition("?")
        environ = {
            "REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "127.0.0.1", "HTTP_COOKIE": cookie, "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr, "wsgi.version": (1, 0),
            "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False,
        }
        status: list[str] = []
        body = app(environ, lambda s, h, exc=None, status=status: status.append(s))
        b"".join(body)
        if hasattr(body, "close"):
            body.close()
        statuses[int(status[0].split()[0])] += 1
    return statuses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", type=int, default=0, help="requests the mold serves before the fork")
    parser.add_argument("--requests", type=int, default=600, help="requests the child serves")
    parser.add_argument("--no-immortalize", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--owned", action="store_true",
                        help="report every page only the child maps (its USS in the writable private "
                        "mappings, copied or new) instead of the copied ones")
    args = parser.parse_args()

    gc.disable()
    sys.path.insert(0, str(HERE))
    sys.path.insert(1, str(HERE.parent))
    from run import load_sequence  # the benchmark's mixed load

    from refork.memory.heap import prepare_heap_for_fork

    app = __import__("bench_wsgi").application
    from django.contrib.auth import get_user_model
    from django.db import connections
    from django.test import Client

    site_dir = HERE / f".site-{sys.version_info[0]}.{sys.version_info[1]}"
    site = json.loads((site_dir / "paths.json").read_text())
    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    warm = serve(app, load_sequence(site, args.warm, 1), cookie)
    connections.close_all()  # as refork's Django integration does before a fork
    report = prepare_heap_for_fork(immortalize=not args.no_immortalize)
    print(f"Python {sys.version.split()[0]}: mold served {args.warm} requests {dict(warm)}; "
          f"collected {report.collected}, frozen {report.frozen}, immortalize {report.immortalize}",
          flush=True)
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
    statuses = serve(app, load_sequence(site, args.requests, 7), cookie)
    seconds = time.perf_counter() - start
    if args.owned:  # before the probe allocates its own page tables
        rollup = {line.split(":")[0]: int(line.split()[1]) for line in
                  Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]}
        maps = writable_private_mappings()
        owned = exclusive_pages(maps)
        lines = [f"child served {args.requests} requests {dict(statuses)} in {seconds:.1f} s; USS "
                 f"{(rollup['Private_Clean'] + rollup['Private_Dirty']) / 1024:.1f} MiB, "
                 f"{len(owned) * PAGE / 2**20:.1f} MiB of it in writable private pages"]
        lines += copied_report(owned, maps, args.top, 12, what="owned")
        os.write(w, ("\n".join(lines) + "\n").encode())
        os._exit(0)
    after = present_pages(maps)
    copied = {page for page, frame in before.items() if after.get(page, frame) != frame}
    new = len(set(after) - set(before))
    rollup = {line.split(":")[0]: int(line.split()[1]) for line in
              Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]}
    uss = rollup["Private_Clean"] + rollup["Private_Dirty"]
    lines = [f"child served {args.requests} requests {dict(statuses)} in {seconds:.1f} s; "
             f"USS {uss / 1024:.1f} MiB, of which {len(copied) * PAGE / 2**20:.1f} MiB of the mold's pages "
             f"copied and {new * PAGE / 2**20:.1f} MiB new pages in the mold's mappings (the rest: "
             "new mappings, or pages the mold had not touched)"]
    lines += copied_report(copied, maps, args.top, 12)
    os.write(w, ("\n".join(lines) + "\n").encode())
    os._exit(0)


if __name__ == "__main__":
    main()
