"""Choose the C allocator (jemalloc by re-exec with LD_PRELOAD) and give memory back (malloc_trim,
jemalloc's purge, glibc's thresholds).

jemalloc must be loaded before the interpreter starts, so ``--allocator jemalloc`` re-execs
the same command with LD_PRELOAD set. It mostly affects allocations pymalloc does not serve
(objects over 512 bytes, buffers, C extensions); set PYTHONMALLOC=malloc to route all of them.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
import re
import sys
import sysconfig
from collections.abc import Callable
from typing import cast

from refork.errors import ConfigError

# One arena, no thread caches: a worker runs Python code one thread at a time (the GIL), so
# more arenas and per-thread caches only add memory that sits half-used in each of them, and the
# lock they save is not contended. Measured with benchmarks/memory_creep.py (4 workers x 4
# threads, docs/benchmarks.md section 4): over 1M requests worker RSS stayed at 40-41 MiB after
# warm-up (+2.5%), where narenas:2 with tcache on (the previous default) drifted 43.7 -> 46.0 MiB
# (+5.2%); side by side over 200k requests it was 4-5 MiB lower than that, at a throughput within
# the noise. tcache_max:4096 or oversize_threshold:1M did not help; dirty_decay_ms:0 saved 2 MiB
# more but was the slowest by far (a purge at almost every free).
# Dirty pages go back to the OS after 1 s, muzzy ones at once.
# background_thread stays OFF: it would start a native thread in the mold, and forking a
# multi-threaded process is unsafe (3.12+ warns); jemalloc also disables background threads in a
# forked child, so the workers would not have them anyway and purge only as they allocate.
JEMALLOC_CONF = "narenas:1,tcache:false,dirty_decay_ms:1000,muzzy_decay_ms:0,background_thread:false"

SEARCH_PATH_ENV = "REFORK_JEMALLOC_PATH"  # os.pathsep-separated files or directories to search
_REEXEC_MARK = "REFORK_ALLOCATOR_REEXEC"  # set across the exec so it cannot loop
_SAVED_PREFIX = "REFORK_SAVED_"  # the user's LD_PRELOAD / MALLOC_CONF, restored after the exec
_NAMES = ("libjemalloc.so.2", "libjemalloc.so")
_MISSING = "jemalloc not found: install it with `apt-get install libjemalloc2` (or drop --allocator jemalloc)"


def _search_path() -> list[str]:
    override = os.environ.get(SEARCH_PATH_ENV)
    if override is not None:
        return [p for p in override.split(os.pathsep) if p]
    dirs = []
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs += [f"/usr/lib/{multiarch}", f"/lib/{multiarch}"]
    return dirs + ["/usr/lib64", "/usr/lib", "/usr/local/lib", "/lib64", "/lib"]


def find_jemalloc() -> str | None:
    """Absolute path of the jemalloc shared library, or None ($REFORK_JEMALLOC_PATH overrides)."""
    for entry in _search_path():
        candidates = [entry] if os.path.isfile(entry) else [os.path.join(entry, n) for n in _NAMES]
        for path in candidates:
            if os.path.isfile(path):
                return path
    return None


def loaded_allocator(pid: int | str = "self") -> str:
    """Which malloc a process uses: "jemalloc", "tcmalloc", "mimalloc", "glibc", "musl" or "unknown"."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return "unknown"
    for lib, name in (("libjemalloc", "jemalloc"), ("libtcmalloc", "tcmalloc"), ("libmimalloc", "mimalloc")):
        if lib in maps:
            return name
    if "libc.so.6" in maps:
        return "glibc"
    if "ld-musl" in maps or "libc.musl" in maps:
        return "musl"
    return "unknown"


def _restore_env() -> None:
    """After the exec: give subprocesses the user's environment, not our LD_PRELOAD."""
    os.environ.pop(_REEXEC_MARK, None)
    for name in ("LD_PRELOAD", "MALLOC_CONF"):
        saved = os.environ.pop(_SAVED_PREFIX + name, None)
        if saved is None:
            continue
        if saved.startswith("="):
            os.environ[name] = saved[1:]
        else:  # was unset
            os.environ.pop(name, None)


def _interpreter_flags() -> list[str]:
    try:
        import subprocess

        return list(subprocess._args_from_interpreter_flags())  # type: ignore[attr-defined]
    except Exception:
        return []


def reexec_with_jemalloc(argv: list[str], module: str = "refork") -> None:
    """Re-exec ``python -m <module> argv[1:]`` with jemalloc preloaded; return if it already is.

    argv is sys.argv: argv[0] (the script or __main__ path) is replaced by ``-m module``
    so that the console script and ``python -m refork`` both work. A MALLOC_CONF set by
    the user is used as is. Raises ConfigError if the library is missing, or if it is
    still not loaded after the exec (e.g. LD_PRELOAD ignored), instead of looping.
    """
    if loaded_allocator() == "jemalloc":
        _restore_env()
        return
    if os.environ.get(_REEXEC_MARK):
        _restore_env()
        raise ConfigError(
            "jemalloc was preloaded with LD_PRELOAD but is not loaded after re-exec "
            "(is the library for another architecture, or LD_PRELOAD ignored?)"
        )
    lib = find_jemalloc()
    if lib is None:
        raise ConfigError(_MISSING)
    env = dict(os.environ)
    for name in ("LD_PRELOAD", "MALLOC_CONF"):
        # "=value" if set (even to ""), "-" if unset: env values cannot hold a NUL.
        env[_SAVED_PREFIX + name] = "=" + os.environ[name] if name in os.environ else "-"
    preload = os.environ.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else lib
    env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    env[_REEXEC_MARK] = "1"
    args = [sys.executable, *_interpreter_flags(), "-m", module, *argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, args, env)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, loaded once; None where there is none (musl)."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


@functools.cache
def _libc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once; None where there is none (musl, no libc.so.6)."""
    fn = getattr(_glibc(), "malloc_trim", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return cast("Callable[[int], int]", fn)


# glibc raises its mmap threshold to the size of each mmapped block a process frees (up to 32 MiB
# on 64-bit) and its trim threshold to twice that, so after a burst of big buffers (a flood of
# WebSocket messages, say) up to 64 MiB it freed stay in its heap. Fixed here: a block of 4 MiB or
# more is mmapped and goes back to the OS when freed, and the heap's free top goes back past 8 MiB.
# Measured with tests/promises/test_promises_memory_websocket.py's flood: worker RSS within 44-48 MiB of its
# baseline at the peak, against 50-66 MiB with glibc's moving thresholds.
GLIBC_MMAP_THRESHOLD = 4 << 20
GLIBC_TRIM_THRESHOLD = 8 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt() parameters (malloc.h)
_GLIBC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def fix_glibc_thresholds() -> bool:
    """Fix glibc's mmap and trim thresholds (see GLIBC_MMAP_THRESHOLD) for this process and the
    ones it forks; True if done. Left alone under another malloc, or when the user's environment
    sets glibc's own tunables."""
    if loaded_allocator() != "glibc" or any(name in os.environ for name in _GLIBC_ENV):
        return False
    mallopt = getattr(_glibc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap = mallopt(_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD)
    return bool(mmap and mallopt(_M_TRIM_THRESHOLD, GLIBC_TRIM_THRESHOLD))


def malloc_trim() -> bool:
    """Ask glibc to return free heap memory to the OS; True if it released some.

    Does not shrink pymalloc arenas (they go back only when empty) and does nothing for
    jemalloc (its decay settings do this work).
    """
    trim = _libc_malloc_trim()
    return trim is not None and bool(trim(0))


@functools.cache
def _jemalloc_mallctl() -> Callable[[bytes, object, object, object, int], int] | None:
    """The preloaded jemalloc's mallctl, looked up once; None where malloc is not jemalloc."""
    try:
        fn = ctypes.CDLL(None).mallctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_JEMALLOC_PURGE_ALL = b"arena.4096.purge"  # MALLCTL_ARENAS_ALL: every arena's dirty and muzzy pages


def release_free_memory() -> str:
    """Return the C allocator's free memory to the OS, wherever it lies in the heap: what a mold
    does before it forks, so that no worker maps what the mold freed. Returns the call made, for
    the log ("" if none: musl, another malloc).

    glibc's own trim releases only the free top of its heap, and jemalloc's decay runs only as a
    process allocates (refork starts no background thread): an idle mold would keep both. On glibc
    this is malloc_trim(0); on jemalloc, the calling thread's cache flushed (if the user's
    MALLOC_CONF has one) and every arena purged.
    """
    mallctl = _jemalloc_mallctl()
    if mallctl is not None:
        mallctl(b"thread.tcache.flush", None, None, None, 0)  # fails harmlessly with tcache:false
        return "jemalloc purge" if mallctl(_JEMALLOC_PURGE_ALL, None, None, None, 0) == 0 else ""
    trim = _libc_malloc_trim()
    if trim is None or loaded_allocator() != "glibc":  # (tcmalloc, mimalloc: glibc's heap is unused)
        return ""
    trim(0)
    return "malloc_trim"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]  # fmt: skip


def fill_free_chunks() -> int:
    """Allocate, and never free, glibc's free chunks inside the heap (not its free top); return the
    bytes taken (0 where malloc is not glibc 2.33+).

    For the monitor, once before it forks: a mold's first allocations would otherwise land in
    those chunks, on pages it shares with the monitor, and each page it writes there becomes the
    monitor's alone (0.4-0.8 MiB of the monitor's USS on a Django site). Filled, they stay shared;
    malloc writes only a chunk's ends, so the pages trimmed inside them stay unmapped.
    """
    if loaded_allocator() != "glibc":
        return 0
    libc = _glibc()
    if libc is None or not hasattr(libc, "mallinfo2"):  # (glibc before 2.33)
        return 0
    mallinfo2, malloc, free = libc.mallinfo2, libc.malloc, libc.free
    mallinfo2.restype = _Mallinfo2
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    taken, size = 0, 1 << 20  # below GLIBC_MMAP_THRESHOLD: from the heap, never mmapped
    for _ in range(100_000):  # a bound: a few thousand chunks in practice
        before = mallinfo2()
        if size < 32 or before.fordblks - before.keepcost < 4096:
            break
        block = malloc(size)
        if block is None:
            break
        after = mallinfo2()
        if (after.arena, after.hblks) != (before.arena, before.hblks) or after.keepcost < before.keepcost:
            free(block)  # no free chunk this big: it came from the top (or mmap)
            size //= 2
            continue
        taken += size
    return taken


_POOL_ROW = re.compile(rb"^ *\d+ +(\d+) +\d+ +\d+ +(\d+) *$", re.MULTILINE)


def free_pymalloc_blocks() -> list[tuple[int, int]]:
    """(block size, free blocks in the pools in use) of each pymalloc size class, as
    sys._debugmallocstats prints them: read in a forked child whose stderr is a pipe, so that
    this process's stderr is left alone. [] where pymalloc is not the allocator."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(write, 2)
            sys._debugmallocstats()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        printed = f.read()
    os.waitpid(pid, 0)
    return [(int(size), int(free)) for size, free in _POOL_ROW.findall(printed.split(b"# arenas")[0])]


def fill_pymalloc_blocks() -> list[object]:
    """Objects that take (nearly) every free block of pymalloc's pools in use: keep them. For the
    monitor, before it forks: a mold's first small objects would otherwise land in those blocks,
    on pages it shares with the monitor, as in fill_free_chunks."""
    header = sys.getsizeof(b"")
    padding: list[object] = []
    for size, free in free_pymalloc_blocks():
        if size == 16:
            padding += [object() for _ in range(free)]
        elif size == 32:
            padding += [i + 0.5 for i in range(free)]  # a float: 24 bytes
        elif size - header > 1:  # bytes of one byte are cached
            padding += [bytes(size - header) for _ in range(free)]
    return padding


class MallocTrimmer:
    """Call malloc_trim at idle moments, at most once per min_interval seconds (it walks the heap)."""

    def __init__(self, min_interval: float) -> None:
        self.min_interval = min_interval
        self._last: float | None = None

    def maybe_trim(self, now: float) -> bool:
        """Trim if the interval passed since the last trim; True if malloc_trim ran now."""
        if self._last is not None and now - self._last < self.min_interval:
            return False
        self._last = now
        malloc_trim()
        return True


class FloodTrim:
    """malloc_trim() when a flood is over (a budget fell to a quarter of its peak, or the
    connections did), and once more when what it left has gone too: the first trim comes while the
    last of the flood is still held (connections closing, their TLS buffers, a cycle only the GC
    frees), and what is freed after it would otherwise stay with the worker until the next flood.
    Sans-IO but for the trim: a loop calls :meth:`tick` once a tick."""

    def __init__(self, trim: Callable[[], object] = malloc_trim) -> None:
        self.trim = trim
        self.owed: tuple[int, ...] | None = None  # what was held at the last tick, a trim owed

    def tick(self, ebbed: bool, held: tuple[int, ...]) -> bool:
        """`ebbed`: a flood ended since the last tick; `held`: what the worker holds now
        (connections, buffered bytes). True when it trimmed: at the ebb, and at the first tick
        after it on which nothing held fell any more (the GC's cycles collected first)."""
        if ebbed:
            self.owed = held
        elif self.owed is None:
            return False
        elif any(now < before for now, before in zip(held, self.owed, strict=True)):
            self.owed = held  # still going: not yet
            return False
        else:
            self.owed = None
            gc.collect()
        self.trim()
        return True
