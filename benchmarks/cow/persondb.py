"""PersonDB: a big read-only dataset served by lookups; how much of it does each worker copy?

Imported (as `persondb:app`), this module builds a dataset of N person records (tuples of
ints, floats and strs) plus a name index, and serves GET /id/<n> and GET /name/<name>.
Run as a script, it benchmarks that app:

    python benchmarks/cow/persondb.py [--python 3.12] [--records 2000000] [--requests 100000]

It measures the dataset's size (RSS delta of building it in a fresh process), serves the app with
4 workers, sends the given number of random lookups, then prints each worker's private memory
(USS and Private_Dirty from smaps_rollup) as a % of the dataset size. Target for refork: <= 2%.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
CITIES = [f"City {i}" for i in range(1000)]

PEOPLE: list[tuple] = []
BY_NAME: dict[str, int] = {}


def name_of(i: int) -> str:
    """A deterministic, unique name for id i (the load client computes it too)."""
    parts, n = [], i * 2654435761 % 4294967296
    for _ in range(4):
        n, r = divmod(n, len(SYLLABLES))
        parts.append(SYLLABLES[r])
    return f"{''.join(parts[:2]).title()} {''.join(parts[2:]).title()}-{i}"


def build(n: int) -> None:
    for i in range(n):
        name = name_of(i)
        PEOPLE.append((i, name, f"{name.lower().replace(' ', '.')}@example.com", 18 + i % 73,
                       CITIES[i * 7 % len(CITIES)], (i % 1000) / 7.0))
        BY_NAME[name] = i


def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
    kind, _, key = environ.get("PATH_INFO", "/").lstrip("/").partition("/")
    rid = None
    if kind == "id" and key.isdigit() and int(key) < len(PEOPLE):
        rid = int(key)
    elif kind == "name":
        rid = BY_NAME.get(key.replace("%20", " "))
    if rid is None:
        start_response("404 Not Found", [("Content-Length", "0")])
        return [b""]
    p = PEOPLE[rid]
    body = f"{p[0]}\t{p[1]}\t{p[2]}\t{p[3]}\t{p[4]}\t{p[5]:.3f}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


if __name__ != "__main__":
    build(int(os.environ.get("PERSONDB_RECORDS", "2000000")))


# ------------------------------------------------------------------------------------ the benchmark


def main() -> None:
    import argparse
    import random
    import subprocess
    import sys
    import time
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here.parent))
    from common import (
        Server,
        announce,
        fmt,
        median,
        print_table,
        refork_cmd,
        role,
        send_requests,
        smaps_rollup,
        uss_kib,
        wait_stable,
        write_results,
    )

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default="3.12", help="interpreter version or path (venv from setup.sh)")
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--servers", default="refork,gunicorn-preload-freeze")
    parser.add_argument("--port", type=int, default=19700)
    parser.add_argument("--measure-dataset", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.measure_dataset:  # child mode: print the RSS delta (KiB) of building the dataset
        def rss() -> int:
            status = Path("/proc/self/status").read_text()
            return int(status.split("VmRSS:")[1].split()[0])
        before = rss()
        build(args.records)
        print(rss() - before)
        return

    venv, info = announce(args.python)
    py = str(venv / "bin" / "python")
    out = subprocess.run([py, __file__, "--measure-dataset", "--records", str(args.records)],
                         capture_output=True, text=True, check=True)
    dataset = int(out.stdout.split()[-1])
    print(f"dataset: {args.records} records, {dataset / 1024:.1f} MiB (RSS delta of building it)")

    rng = random.Random(42)
    paths = [f"/id/{rng.randrange(args.records)}" if rng.random() < 0.7
             else f"/name/{name_of(rng.randrange(args.records)).replace(' ', '%20')}"
             for _ in range(args.requests)]
    w, bind = str(args.workers), "127.0.0.1:{port}"
    conf = here / "gunicorn_freeze.conf.py"
    specs = {
        "refork": [*refork_cmd(venv), "-w", w, "--chdir", str(here), "-b", bind, "persondb:app"],
        "gunicorn-preload-freeze": [str(venv / "bin" / "gunicorn"), "-w", w, "--preload", "-c", str(conf),
                                    "-b", bind, "--timeout", "120", "persondb:app"],
    }
    env = {"PERSONDB_RECORDS": str(args.records)}
    results: dict[str, dict] = {}
    for i, name in enumerate(args.servers.split(",")):
        port = args.port + i
        server = Server(name, "wsgi", [a.replace("{port}", str(port)) for a in specs[name]], port, here, env)
        print(f"{name}: starting", flush=True)
        error = server.start(timeout=300.0, path="/id/1")
        if error:
            server.stop()
            print(f"  {error}")
            results[name] = {"error": error}
            continue
        try:
            wait_stable(server, args.workers + 1)
            load = send_requests(port, paths, args.requests, concurrency=2 * args.workers, keepalive=False)
            print(f"  {load['requests']} requests in {load['seconds']:.1f}s, {load['errors']} errors")
            for sample in load["error_samples"]:
                print(f"    error: {sample}")
            root = server.proc.pid if server.proc else 0
            procs = []
            for pid in wait_stable(server, args.workers + 1):
                f = smaps_rollup(pid)
                procs.append({"pid": pid, "role": role(pid, root), "pss": f.get("Pss", 0),
                              "uss": uss_kib(f), "private_dirty": f.get("Private_Dirty", 0)})
        finally:
            server.stop()
        workers = [p for p in procs if p["role"] == "worker"]
        for p in workers:
            uss, dirty = p["uss"], p["private_dirty"]
            print(f"    worker {p['pid']}: USS {uss / 1024:.1f} MiB ({100 * uss / dataset:.2f}%), "
                  f"Private_Dirty {dirty / 1024:.1f} MiB ({100 * dirty / dataset:.2f}%)")
        results[name] = {"load": load, "processes": procs,
                         "total_pss": sum(p["pss"] for p in procs),
                         "worker_uss": median([p["uss"] for p in workers]),
                         "worker_private_dirty": median([p["private_dirty"] for p in workers]),
                         "worker_uss_max": max((p["uss"] for p in workers), default=None)}

    def pct(kib: float | None) -> str:
        return fmt(kib and 100 * kib / dataset, ".2f", "%")

    print(f"\n{args.workers} workers, {args.requests} random lookups, dataset {dataset / 1024:.1f} MiB, "
          f"Python {info.get('python')}")
    rows = []
    for name, r in results.items():
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "-", r["error"]])
        else:
            rows.append([name, f"{r['total_pss'] / 1024:.1f}", fmt(r["worker_uss"] / 1024),
                         pct(r["worker_uss"]), pct(r["worker_uss_max"]), pct(r["worker_private_dirty"]), ""])
    headers = ["server", "total PSS MiB", "worker USS MiB", "USS % dataset", "max USS %", "Priv_Dirty %",
               "note"]
    print_table(headers, rows)
    checks = {}
    if "refork" in results and "error" not in results["refork"]:
        value = 100 * results["refork"]["worker_uss_max"] / dataset
        checks["refork max worker USS <= 2% of dataset"] = {"percent": value, "pass": value <= 2.0}
        verdict = "PASS" if value <= 2.0 else "FAIL"
        print(f"\n[{verdict}] refork every worker's USS <= 2% of dataset (max): {value:.2f}%")
    path = write_results(f"persondb-py{info.get('python')}", {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "versions": info, "records": args.records,
        "requests": args.requests, "dataset_kib": dataset, "results": results, "checks": checks,
    })
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
