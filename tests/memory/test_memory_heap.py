"""Heap preparation before fork: immortalization stops copy-on-write of the shared heap.

Everything that changes the heap (immortalize, freeze) runs in a subprocess: immortal
objects are never freed, which must not leak into the pytest process.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
from support import paths

from refork.memory import heap

SUPPORTED, REASON = heap.immortalize_support()
needs_immortal = pytest.mark.skipif(not SUPPORTED, reason=f"immortalization unsupported: {REASON}")
linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs /proc")
MiB = 1 << 20


def run_python(code: str, *args: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_support_reports_a_reason() -> None:
    ok, reason = heap.immortalize_support()
    if sys.version_info < (3, 12):
        assert not ok
        assert reason == f"Python 3.{sys.version_info[1]} (needs CPython 3.12+)"
    elif sys.version_info < (3, 16) and not any(map(sysconfig_flag, ("Py_GIL_DISABLED", "Py_DEBUG"))):
        assert ok, reason
        assert reason == ""
    else:
        assert not ok and reason, reason


def sysconfig_flag(name: str) -> bool:
    import sysconfig

    return bool(sysconfig.get_config_var(name))


@pytest.mark.skipif(SUPPORTED, reason="checks the unsupported path")
def test_unsupported_raises_and_prepare_still_freezes() -> None:
    with pytest.raises(RuntimeError, match="unsupported"):
        heap.immortalize_heap()
    proc = run_python(
        """
        import gc
        from refork.memory.heap import prepare_heap_for_fork
        r = prepare_heap_for_fork(immortalize=True)
        assert r.immortalize.startswith("unsupported: "), r
        assert r.immortalized == 0 and r.frozen == gc.get_freeze_count() > 0, r
        print(r.immortalize)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "needs CPython 3.12+" in proc.stdout or "build" in proc.stdout


def test_prepare_without_immortalize() -> None:
    proc = run_python(
        """
        import gc
        from refork.memory.heap import prepare_heap_for_fork, is_immortal
        x = ["a" + str(i) for i in range(10)]
        r = prepare_heap_for_fork(immortalize=False)
        assert r.immortalize == "off (--no-immortalize)", r
        assert r.immortalized == 0 and r.frozen > 1000 and r.seconds >= 0, r
        assert not is_immortal(x) and not is_immortal(x[3])
        """
    )
    assert proc.returncode == 0, proc.stderr


def test_failed_immortalization_still_freezes(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> int:
        raise MemoryError("walk stack")

    monkeypatch.setattr(heap, "immortalize_support", lambda: (True, ""))
    monkeypatch.setattr(heap, "immortalize_heap", boom)
    try:
        report = heap.prepare_heap_for_fork(immortalize=True)
        assert report.immortalize == "failed: MemoryError('walk stack')"
        # frozen objects can be freed afterwards (by another thread of the test process), not added
        assert report.immortalized == 0 and 0 < gc.get_freeze_count() <= report.frozen
    finally:
        gc.unfreeze()


def test_disable_and_enable_gc() -> None:
    was = gc.isenabled()
    try:
        heap.disable_gc_early()
        assert not gc.isenabled()
        heap.after_fork_in_child()
        assert gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


HEADER = """
import ctypes, sys
from refork.memory.heap import prepare_heap_for_fork

def header(obj):  # 64-bit little-endian: the low 32 bits count, ob_flags is the top 16 (3.14+)
    word = ctypes.c_uint64.from_address(id(obj)).value
    return word & 0xFFFFFFFF, word >> 48

class Local:
    pass

THING = Local()
prepare_heap_for_fork(immortalize=True)
print(*header(THING), *header(None), *header(Local))
"""


@needs_immortal
def test_immortal_header_is_the_one_cpython_writes() -> None:
    """The refcount word and ob_flags of an immortalized object are those of CPython's own
    _Py_SetImmortalUntracked in this version (0xFFFFFFFF before 3.14, 3 << 30 and the
    immortal flag from 3.14); the statically allocated flag stays with static objects."""
    proc = run_python(HEADER)
    assert proc.returncode == 0, proc.stderr
    count, flags, none_count, none_flags, cls_count, cls_flags = map(int, proc.stdout.split())
    if sys.version_info >= (3, 14):
        immortal_flag, static_flag = 1 << 0, 1 << 2  # _Py_IMMORTAL_FLAGS, _Py_STATICALLY_ALLOCATED_FLAG
        assert (count, flags) == (3 << 30, immortal_flag)
        assert (cls_count, cls_flags) == (3 << 30, immortal_flag)
        assert none_count == 3 << 30 and none_flags == immortal_flag | static_flag
    else:
        assert (count, cls_count, none_count) == (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF)


@needs_immortal
def test_reaches_what_the_gc_does_not_traverse() -> None:
    proc = run_python(
        """
        import types
        from refork.memory.heap import prepare_heap_for_fork, is_immortal

        class Point:
            __slots__ = ("x", "y")

        def f(a, b=("default", 1.5)):
            return "const-string" + a

        table = {"".join(["key", str(i)]): "".join(["value", str(i)]) for i in range(100)}
        number = 10**30
        r = prepare_heap_for_fork(immortalize=True)
        key = next(iter(table))
        checks = {
            "str-keyed dict key": is_immortal(key),
            "dict value": is_immortal(table[key]),
            "untracked dict in globals": is_immortal(table),
            "function": is_immortal(f),
            "code": is_immortal(f.__code__),
            "co_consts": is_immortal(f.__code__.co_consts),
            "const str": all(is_immortal(c) for c in f.__code__.co_consts if c == "const-string"),
            "co_names/localsplusnames": is_immortal(f.__code__.co_varnames[0]),
            "co_linetable": is_immortal(f.__code__.co_linetable),
            "co_filename": is_immortal(f.__code__.co_filename),
            "defaults": is_immortal(f.__defaults__) and is_immortal(f.__defaults__[0][1]),
            "heap type": is_immortal(Point),
            "type name": is_immortal(Point.__name__),
            "slots": is_immortal(Point.__slots__),
            "big int": is_immortal(number),
        }
        bad = [k for k, v in checks.items() if not v]
        assert not bad, bad
        assert r.immortalize == f"on ({r.immortalized:,} objects)", r
        assert r.immortalized > 10000 and r.frozen > 1000, r
        """
    )
    assert proc.returncode == 0, proc.stderr


COW_CHILD = """
import gc, os, sys
from refork.memory.accounting import read_memory
from refork.memory.heap import after_fork_in_child, disable_gc_early, prepare_heap_for_fork

def build():
    strings = [f"key-{i:08d}-{'x' * 24}" for i in range(500_000)]
    return strings, {s: i * 3 + 1000 for i, s in enumerate(strings)}

def child_reads(strings, table):
    after_fork_in_child()
    before = read_memory(os.getpid())
    total = 0
    for s in strings:
        total += (hash(s) & 1) + (table[s] & 1)
    for k, v in table.items():
        total += len(k) + (v & 1)
    after = read_memory(os.getpid())
    return after.private_dirty - before.private_dirty, after.minflt - before.minflt

def fork_and_measure(strings, table):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        dirty, faults = child_reads(strings, table)
        os.write(w, f"{dirty} {faults}".encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 100).decode()
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
    return out

disable_gc_early()
immortalize = sys.argv[1] == "1"
if sys.argv[2] == "globals":
    STRINGS, TABLE = build()
    report = prepare_heap_for_fork(immortalize=immortalize)
    print(fork_and_measure(STRINGS, TABLE), report.immortalized)
else:
    def main():
        strings, table = build()  # only the running frame refers to these
        report = prepare_heap_for_fork(immortalize=immortalize)
        print(fork_and_measure(strings, table), report.immortalized)
    main()
"""


def measure_child_dirty(immortalize: bool, where: str) -> tuple[int, int, int]:
    proc = run_python(COW_CHILD, "1" if immortalize else "0", where)
    assert proc.returncode == 0, proc.stderr
    dirty, faults, immortalized = map(int, proc.stdout.split())
    return dirty, faults, immortalized


@needs_immortal
@linux_only
@pytest.mark.parametrize("where", ["globals", "locals"])
def test_immortal_heap_is_not_copied_when_read(where: str) -> None:
    dirty, faults, immortalized = measure_child_dirty(True, where)
    assert immortalized >= 1_000_000
    assert dirty < 1 * MiB, f"child dirtied {dirty / MiB:.2f} MiB ({faults} faults)"


@linux_only
def test_negative_control_plain_heap_is_copied() -> None:
    dirty, faults, immortalized = measure_child_dirty(False, "globals")
    assert immortalized == 0
    assert dirty > 10 * MiB, f"child dirtied only {dirty / MiB:.2f} MiB: the measurement cannot fail"
    assert faults > 2000


@needs_immortal
@linux_only
def test_second_preparation_in_a_forked_descendant() -> None:
    proc = run_python(
        """
        import gc, os
        from refork.memory.accounting import read_memory
        from refork.memory.heap import (
            after_fork_in_child, disable_gc_early, is_immortal, prepare_heap_for_fork)

        disable_gc_early()
        OLD = {"k" + str(i): i for i in range(1000)}
        first = prepare_heap_for_fork(immortalize=True)
        assert is_immortal(OLD)

        def promoted_mold():
            after_fork_in_child()          # a worker ...
            global NEW, NEWSTR
            NEW = [f"new-{i:07d}-{'y' * 30}" for i in range(200_000)]
            NEWSTR = "".join(["stored", "-in-old"])
            OLD["added-later"] = NEWSTR   # a new object reachable only via an old immortal dict
            local_only = {"only": 10**40}
            assert not is_immortal(NEW) and not is_immortal(NEWSTR)
            disable_gc_early()             # ... promoted to be the next mold
            second = prepare_heap_for_fork(immortalize=True)
            assert second.immortalized >= 200_000, second
            assert second.immortalized < first.immortalized + 200_000 - 1000, (first, second)
            for obj in (NEW, NEW[0], NEW[-1], NEWSTR, local_only, local_only["only"]):
                assert is_immortal(obj), repr(obj)[:60]
            assert gc.get_freeze_count() >= first.frozen
            r, w = os.pipe()
            pid = os.fork()                # a worker of the new mold
            if pid == 0:
                after_fork_in_child()
                before = read_memory(os.getpid())
                n = sum(len(s) for s in NEW) + len(OLD["added-later"])
                after = read_memory(os.getpid())
                os.write(w, str(after.private_dirty - before.private_dirty).encode())
                os._exit(0)
            os.close(w)
            dirty = int(os.read(r, 100))
            assert os.waitpid(pid, 0)[1] == 0
            assert dirty < (1 << 20), dirty
            print(second.immortalize, dirty)

        pid = os.fork()
        if pid == 0:
            try:
                promoted_mold()
            except BaseException:
                import traceback; traceback.print_exc()
                os._exit(1)
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        """
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout


CLEAN_EXIT = """
import asyncio, collections, dataclasses, decimal, email.parser, gc, json, logging, os, re
import sqlite3, sys, threading, typing, urllib.request, xml.etree.ElementTree
from refork.memory.heap import after_fork_in_child, disable_gc_early, prepare_heap_for_fork

disable_gc_early()
logging.basicConfig(level=logging.INFO)

async def serve(n):
    await asyncio.sleep(0)
    return json.dumps({"n": n, "d": str(decimal.Decimal(n) / 3)})

asyncio.run(serve(1))                                  # warm up
t = threading.Thread(target=lambda: re.compile(r"x+y").match("xxy")); t.start(); t.join()
db = sqlite3.connect(":memory:"); db.execute("create table t (x)"); db.close()
report = prepare_heap_for_fork(immortalize=True)
assert report.immortalized > 0, report

pid = os.fork()
if pid == 0:
    after_fork_in_child()
    assert asyncio.run(serve(2)).startswith('{"n": 2')
    threads = [threading.Thread(target=asyncio.run, args=(serve(i),)) for i in range(4)]
    for th in threads: th.start()
    for th in threads: th.join()
    gc.collect()
    email.parser.Parser().parsestr("Subject: hi\\n\\nbody")
    logging.getLogger("child").info("done")
    sys.exit(0)                                         # normal interpreter finalization
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("ok")
"""


@needs_immortal
@pytest.mark.parametrize("flags", [(), ("-X", "dev")], ids=["plain", "dev-mode"])
def test_interpreter_exits_cleanly_after_immortalizing(flags: tuple[str, ...]) -> None:
    proc = run_python(CLEAN_EXIT, flags=flags)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    stderr = [line for line in proc.stderr.splitlines() if not line.startswith("INFO:")]
    assert stderr == [], proc.stderr


LAZY = """
import os, sys
sys.path.insert(0, sys.argv[1])
import lazy_app
from refork.memory.heap import prepare_heap_for_fork

assert set(lazy_app.bindings().values()) == {"lazy_import"}, lazy_app.bindings()
report = prepare_heap_for_fork(immortalize=True)
assert report.lazy_imports > 0 and "lazy imports resolved" in report.describe(), report
assert lazy_app.bindings() == {"json": "module", "xml": "module", "Decimal": "type", "F": "ABCMeta"}
assert type(vars(lazy_app)["refork_no_such_module"]).__name__ == "lazy_import"  # left to fail later
assert sys.lazy_modules == {"refork_no_such_module"}, sys.lazy_modules
assert "xml.dom.minidom" in sys.modules  # `lazy import a.b.c` loads a.b.c, not only a
pid = os.fork()
if pid == 0:
    loaded = set(sys.modules)
    assert lazy_app.use() == '["0.125", "1/3", "a"]'
    assert set(sys.modules) == loaded, set(sys.modules) - loaded  # the worker imported nothing
    sys.exit(0)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
print(report.describe())
"""


def test_lazy_imports_are_resolved_before_the_fork() -> None:
    """PEP 810 (3.15): what the app imports lazily is loaded in the mold, its placeholders rebound
    in the module's globals, so that a worker neither imports it nor writes the shared dict."""
    if sys.version_info < (3, 15):  # no lazy imports: nothing to resolve, nothing said
        report = heap.prepare_heap_for_fork(immortalize=False)
        gc.unfreeze()
        assert report.lazy_imports == 0 and "lazy" not in report.describe()
        return
    proc = run_python(LAZY, str(paths.TESTS / "apps"))
    assert proc.returncode == 0, proc.stderr
    assert ", lazy imports resolved " in proc.stdout


@pytest.mark.skipif(sys.version_info < (3, 15), reason="`lazy import` is Python 3.15 syntax")
def test_a_worker_finds_the_lazy_imports_resolved(start_server) -> None:
    server = start_server(app="apps.lazy_app:app")
    status, body = server.get("/")
    assert status == 200, body
    answer = json.loads(body)
    assert answer["bindings"] == {"json": "module", "xml": "module", "Decimal": "type", "F": "ABCMeta"}
    assert answer["imported_by_worker"] == [] and answer["use"] == '["0.125", "1/3", "a"]'
