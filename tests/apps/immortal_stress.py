"""Stress an immortalized heap: `python immortal_stress.py SCENARIO...`.

As a mold does, this process imports a good part of the standard library and callheavy.py,
warms them up and prepares its heap (collect, immortalize where supported, freeze). Each
scenario then runs in a forked child, which ends with a normal interpreter shutdown, and
afterwards in this process. Output: a first line `immortalize <state>`, then `ok SCENARIO WHO`
for every run that passed its checks (WHO: child, parent, grandchild) and `atexit WHO` from
the shutdown scenario. Exit status 0 only if every child exited with 0 and every check held;
a child killed by a signal is named on stderr ("... killed by SIGSEGV").
"""

from __future__ import annotations

import argparse  # noqa: F401 - the imports are the heap: a good part of the standard library
import ast
import asyncio
import base64
import collections  # noqa: F401
import concurrent.futures
import configparser
import contextlib
import csv
import ctypes
import dataclasses  # noqa: F401
import datetime
import decimal
import difflib  # noqa: F401
import email.message
import email.parser
import fractions
import gc
import hashlib
import html.parser  # noqa: F401
import http.client  # noqa: F401
import importlib
import inspect  # noqa: F401
import io
import ipaddress
import itertools  # noqa: F401
import json
import logging
import os
import pathlib  # noqa: F401
import pickle
import random  # noqa: F401
import re
import signal
import sqlite3
import statistics
import string  # noqa: F401
import sys
import textwrap
import threading
import traceback
import typing  # noqa: F401
import urllib.parse
import uuid
import weakref
import xml.etree.ElementTree as ET
import zlib  # noqa: F401

import callheavy

from refork.memory.heap import after_fork_in_child, disable_gc_early, is_immortal, prepare_heap_for_fork

SUPPORTED = sys.version_info >= (3, 12)
IMMORTAL_REFCNT = 3 << 30 if sys.version_info >= (3, 14) else 0xFFFFFFFF
EXPECTED: dict[int, int] = {}
EXPECTED_CALLS: list[int] = []
SAMPLE: list[object] = []


def warm_up() -> None:
    """What a mold's import and warm-up leave on the heap."""
    for n in range(48):
        EXPECTED[n] = callheavy.answer(n, with_async=n % 8 == 0)
    EXPECTED_CALLS.append(callheavy.mixed_calls(40_000))
    json.loads(json.dumps({"a": [1, 2.5, "x"], "b": None}))
    re.compile(r"(?P<word>\w+)-(\d+)").findall("alpha-1 beta-22")
    str(decimal.Decimal(1) / 7) + str(fractions.Fraction(3, 9))
    email.parser.Parser().parsestr("Subject: hi\n\nbody")
    ET.fromstring("<a><b x='1'/></a>").find("b")
    db = sqlite3.connect(":memory:")
    db.execute("create table t (x)")
    db.close()
    ast.parse("x = [i for i in range(3)]")
    hashlib.sha256(b"x").hexdigest() + base64.b64encode(b"x").decode()
    uuid.uuid5(uuid.NAMESPACE_DNS, "x")
    list(csv.reader(io.StringIO("a,b\n1,2\n")))
    configparser.ConfigParser().read_string("[s]\nk = v\n")
    statistics.mean([1, 2, 3]) + ipaddress.ip_address("127.0.0.1").version
    urllib.parse.urlsplit("http://example.invalid/a?b=c")
    datetime.datetime(2026, 1, 1).isoformat()
    logging.getLogger("stress").debug("warm")
    SAMPLE.extend(callheavy.SHAPES[:50])
    SAMPLE.extend(list(callheavy.RECORDS.values())[:50])
    SAMPLE.extend(r.name for r in list(callheavy.RECORDS.values())[:50])
    SAMPLE.extend(callheavy.ADDERS[:20])
    SAMPLE.extend(f.__code__ for f in callheavy.ADDERS[:5])
    SAMPLE.extend([callheavy.answer, callheavy.answer.__code__, callheavy.Shape, callheavy.RECORDS])
    SAMPLE.extend([callheavy.ORDERED, callheavy.TABLE, callheavy.TABLE[3], callheavy.TICKER])


def check_heap(who: str) -> None:
    """The shared objects are still immortal, their count where CPython's own code leaves it
    (0xFFFFFFFF before 3.14; 3 << 30 plus or minus what uncounted references moved it), and
    the app still computes what it did before the fork."""
    if SUPPORTED:
        for obj in SAMPLE:
            word = ctypes.c_uint64.from_address(id(obj)).value
            count = word & 0xFFFFFFFF
            assert is_immortal(obj), f"{who}: {type(obj).__name__} became mortal: count {count:#x}"
            assert abs(count - IMMORTAL_REFCNT) < 10_000, f"{who}: {type(obj).__name__} count {count:#x}"
            if sys.version_info >= (3, 14):
                assert word >> 48 & 1, f"{who}: {type(obj).__name__} lost _Py_IMMORTAL_FLAGS"
    for n in (0, 7, 8, 47):
        assert callheavy.answer(n, with_async=n % 8 == 0) == EXPECTED[n], f"{who}: wrong answer for {n}"


def scenario_gc() -> None:
    """Collections of every generation, many times, over cycles that hold immortal objects."""
    gc.enable()
    for _ in range(25):
        junk = []
        for i in range(300):
            a: dict[str, object] = {"shape": callheavy.SHAPES[i], "record": callheavy.RECORDS[i]}
            a["cycle"] = [a, callheavy.ADDERS[i % 64], callheavy.answer]
            junk.append(a)
        del junk
        for generation in (0, 1, 2):
            gc.collect(generation)
        gc.collect()
    assert gc.get_referrers(callheavy.SHAPES[0]) is not None
    assert len(gc.get_objects()) > 0
    gc.unfreeze()  # an app that undoes the freeze: the collector then walks the immortal heap
    gc.collect()
    gc.freeze()


def scenario_threads() -> None:
    """Threads hammering the same shared objects, with the GIL switching as often as it can."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    errors: list[str] = []
    shared = callheavy.SHARED_LOG

    def hammer(t: int) -> None:
        try:
            for i in range(60):
                n = (t * 7 + i) % 48
                got = callheavy.answer(n)
                if n % 8 and got != EXPECTED[n]:
                    errors.append(f"thread {t}: answer({n}) = {got}")
                shared.append(n)
                json.dumps(callheavy.TABLE[n])
                callheavy.BY_NAME.get(f"name-{n:05d}")
                re.match(r"name-(\d+)", callheavy.RECORDS[n].name)
                if len(shared) > 100:
                    shared.clear()
        except BaseException as e:  # a thread's failure fails the scenario
            errors.append(f"thread {t}: {e!r}")

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(8)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for th in threads:
            th.start()
        results = list(pool.map(callheavy.answer, range(1, 48, 8)))
        for th in threads:
            th.join()
    sys.setswitchinterval(interval)
    assert not errors, errors
    assert results == [EXPECTED[n] for n in range(1, 48, 8)]


def scenario_exceptions() -> None:
    """Exceptions raised and caught through immortal code and frames, chained, formatted, kept."""

    def down(k: int) -> int:
        if k == 0:
            raise callheavy.NotFound(k)
        return down(k - 1) + 1

    for n in range(20_000):
        callheavy.guarded(n * 7)
    for _ in range(200):
        try:
            down(100)
        except callheavy.AppError as e:
            callheavy.ERRORS.append(e)
            text = "".join(traceback.format_exception(e))
            assert "NotFound" in text
        try:
            callheavy.RECORDS[-1]
        except KeyError as e:
            callheavy.ERRORS.append(e)
        try:
            callheavy.lookup(4500)
        except callheavy.NotFound as e:
            try:
                raise ValueError("wrapped") from e
            except ValueError as wrapped:
                assert wrapped.__cause__ is e
    if sys.version_info >= (3, 11):
        group = ExceptionGroup("many", [callheavy.AppError(1), callheavy.NotFound(2)])  # noqa: F821
        with contextlib.suppress(ExceptionGroup):  # noqa: F821
            raise group
    callheavy.ERRORS.clear()


def scenario_generators() -> None:
    """Generators (the mold's own suspended one too), send/throw/close, coroutines, async generators."""
    for n in range(3000):
        assert sum(callheavy.fib_gen(15)) == 986
        gen = callheavy.echo()
        next(gen)
        gen.send(n)
        gen.throw(callheavy.AppError(1))
        gen.close()
        abandoned = callheavy.chained(10)
        next(abandoned)
        del abandoned
    first = next(callheavy.TICKER)
    assert next(callheavy.TICKER) == first + 1

    @contextlib.contextmanager
    def managed():
        yield callheavy.SHAPES[1]

    with managed() as shape:
        assert shape.area() > 0

    async def main() -> int:
        total = 0
        for n in range(50):
            total += await callheavy.gather(n)
        results = await asyncio.gather(*(callheavy.fetch(n) for n in range(100)))
        return total + sum(results)

    assert asyncio.run(main()) > 0


def scenario_calls() -> None:
    """More than 100k calls of every kind, so that the specializing interpreter rewrites the code."""
    for _ in range(3):
        assert callheavy.mixed_calls(40_000) == EXPECTED_CALLS[0]
    for _ in range(6):
        for n in range(48):
            assert callheavy.answer(n) == EXPECTED[n] or n % 8 == 0


def scenario_free() -> None:
    """Containers of immortal objects freed, immortal containers cleared, modules reloaded."""
    for _ in range(20):
        records = list(callheavy.RECORDS.values())
        copies = [dict(callheavy.BY_NAME), set(callheavy.TAGS), tuple(callheavy.SHAPES)]
        del records, copies
    callheavy.GROUPS.clear()
    del callheavy.SHAPES[:100]
    while callheavy.SLOTTED:
        callheavy.SLOTTED.pop()
    for key in list(callheavy.RECORDS)[:1000]:
        del callheavy.RECORDS[key]
    callheavy.ORDERED.clear()
    callheavy.BY_NAME.clear()
    del callheavy.TABLE
    pickle.loads(pickle.dumps(list(callheavy.RECORDS.values())[:100]))
    importlib.reload(textwrap)
    sys.modules.pop("csv")
    importlib.import_module("csv")
    gc.collect()


def scenario_shutdown() -> None:
    """What a worker leaves for the interpreter's shutdown: a daemon thread, atexit, finalizers."""
    who = "child" if os.getpid() != PARENT else "parent"

    def still_works() -> bool:  # nothing the free scenario deletes
        return sum(callheavy.fib_gen(15)) == 986 and callheavy.guarded(4321) == -(4321 % 97) - 1

    stop = threading.Event()
    threading.Thread(target=lambda: stop.wait(60), daemon=True).start()
    holder = callheavy.Shape(3)
    weakref.finalize(holder, still_works)
    callheavy.KEEP.append(holder)
    log = open(os.devnull, "w")  # noqa: SIM115 - closed at exit
    callheavy.KEEP.append(log)
    import atexit

    atexit.register(log.close)
    atexit.register(lambda: print(f"atexit {who} {still_works()}", flush=True))
    logging.getLogger("stress").addHandler(logging.StreamHandler(io.StringIO()))


def scenario_refork() -> None:
    """A refork of a refork: this process, forked from the mold, prepares its heap again (as a
    promoted worker does) with new objects stored in old immortal containers, forks a
    grandchild that runs every scenario, and checks how it ended."""
    new = [callheavy.Square(i) for i in range(2000)]
    callheavy.RECORDS[100_000] = callheavy.Record(100_000, "".join(["late", "-record"]), ("tag1",), 0.5)
    callheavy.KEEP.append(new)
    disable_gc_early()
    report = prepare_heap_for_fork(immortalize=True)
    if SUPPORTED:
        assert report.immortalize.startswith("on ("), report
        assert is_immortal(new[0]) and is_immortal(callheavy.RECORDS[100_000].name)
        SAMPLE.extend([new[0], new[-1], callheavy.RECORDS[100_000]])
    if os.getpid() == PARENT:
        return  # in the mold itself there is nothing more to fork here: run_in_child did
    failed = run_in_child(["gc", "threads", "exceptions", "generators", "calls", "free"], "grandchild")
    assert not failed, failed


def scenario_segfault() -> None:
    """The negative control: a child that dies by SIGSEGV must be reported as such."""
    ctypes.string_at(0)


SCENARIOS = {name[len("scenario_") :]: fn for name, fn in globals().items() if name.startswith("scenario_")}
ORDER = ["gc", "threads", "exceptions", "generators", "calls", "refork", "shutdown", "free", "segfault"]
PARENT = os.getpid()


def run(names: list[str], who: str) -> None:
    for name in names:
        SCENARIOS[name]()
        if name != "free":  # what it deletes, the answers need
            check_heap(f"{who} after {name}")
        print(f"ok {name} {who}", flush=True)


def run_in_child(names: list[str], who: str) -> list[str]:
    """Run the scenarios in a forked child that exits through a normal shutdown; return failures."""
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        after_fork_in_child()
        try:
            run(names, who)
        except Exception:  # not SystemExit: a grandchild's normal exit passes through here
            traceback.print_exc()
            os._exit(3)
        sys.exit(0)  # the interpreter's own shutdown, with everything the scenarios left
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        return [f"{who} running {'+'.join(names)} was killed by {sig}"]
    code = os.waitstatus_to_exitcode(status)
    return [f"{who} running {'+'.join(names)} exited with {code}"] if code else []


def main() -> int:
    names = ORDER[:-1] if sys.argv[1:] == ["all"] else sys.argv[1:]
    disable_gc_early()
    warm_up()
    report = prepare_heap_for_fork(immortalize=True)
    print(f"immortalize {report.immortalize}", flush=True)
    failures = run_in_child(names, "child")
    if not failures:
        run([n for n in names if n != "segfault"], "parent")
    for failure in failures:
        print(failure, file=sys.stderr, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
