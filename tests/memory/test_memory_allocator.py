"""Allocator selection (jemalloc re-exec), malloc_trim, and the optional memray capture."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from refork.config import ConfigError
from refork.memory import allocator, profiling
from refork.memory.allocator import (
    JEMALLOC_CONF,
    FloodTrim,
    MallocTrimmer,
    find_jemalloc,
    loaded_allocator,
    malloc_trim,
    reexec_with_jemalloc,
)

JEMALLOC = find_jemalloc()
needs_jemalloc = pytest.mark.skipif(JEMALLOC is None, reason="libjemalloc2 not installed")
linux_only = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")

PROBE = """
import json, os, sys
from refork.memory.allocator import loaded_allocator, reexec_with_jemalloc

if __name__ == "__main__":
    reexec_with_jemalloc(sys.argv, module="probe")
    with open("/proc/self/environ", "rb") as f:
        exec_env = dict(
            kv.split(b"=", 1) for kv in f.read().split(b"\\0") if b"=" in kv
        )
    print(json.dumps({
        "allocator": loaded_allocator(),
        "argv": sys.argv[1:],
        "exec_malloc_conf": exec_env.get(b"MALLOC_CONF", b"").decode(),
        "exec_preload": exec_env.get(b"LD_PRELOAD", b"").decode(),
        "env_preload": os.environ.get("LD_PRELOAD"),
        "env_malloc_conf": os.environ.get("MALLOC_CONF"),
        "marks": sorted(k for k in os.environ if k.startswith("REFORK_")),
        "optimize": sys.flags.optimize,
    }))
"""


def run_probe(tmp_path: Path, env_extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "probe.py").write_text(textwrap.dedent(PROBE))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-O", "-m", "probe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )


@linux_only
def test_this_process_uses_glibc() -> None:
    assert loaded_allocator() == "glibc"
    assert loaded_allocator(os.getpid()) == "glibc"
    assert loaded_allocator(2**22 + 12345) == "unknown"


@needs_jemalloc
def test_find_jemalloc() -> None:
    assert JEMALLOC is not None and os.path.isabs(JEMALLOC) and "libjemalloc" in JEMALLOC


@needs_jemalloc
@linux_only
def test_reexec_loads_jemalloc_and_restores_the_environment(tmp_path: Path) -> None:
    import json

    proc = run_probe(tmp_path, {}, "serve", "app:wsgi", "--workers=2")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["allocator"] == "jemalloc"
    assert out["argv"] == ["serve", "app:wsgi", "--workers=2"]
    assert out["optimize"] == 1  # interpreter flags survive the exec
    assert out["exec_preload"] == JEMALLOC
    assert out["exec_malloc_conf"] == JEMALLOC_CONF
    assert "background_thread:false" in JEMALLOC_CONF
    # Subprocesses the app starts get the user's environment back.
    assert out["env_preload"] is None and out["env_malloc_conf"] is None
    already_set = sorted(k for k in os.environ if k.startswith("REFORK_"))  # e.g. REFORK_TEST_PYTHONS
    assert out["marks"] == already_set  # no marker of the re-exec is left behind


@needs_jemalloc
@linux_only
def test_jemalloc_accepts_the_default_conf() -> None:
    # abort_conf:true makes jemalloc abort on any option it does not know or cannot parse (an
    # option renamed between versions would otherwise only print a warning and be ignored).
    env = {**os.environ, "LD_PRELOAD": str(JEMALLOC), "MALLOC_CONF": JEMALLOC_CONF + ",abort_conf:true"}
    code = "import ctypes; m = ctypes.CDLL(None).malloc; m.restype = ctypes.c_void_p; assert m(1 << 20)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "<jemalloc>" not in proc.stderr
    assert "narenas:1" in JEMALLOC_CONF and "tcache:false" in JEMALLOC_CONF  # measured: memory_creep.py


def loaded_library(name: str) -> str:
    """The path of a shared library this process has mapped whose file name starts with `name`."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith(name):
                return path
    return ""


@needs_jemalloc
@linux_only
def test_reexec_keeps_user_settings(tmp_path: Path) -> None:
    import json

    libm = loaded_library("libm.so")  # the one this interpreter runs with (its glibc's)
    extra = {"MALLOC_CONF": "narenas:3"}  # not refork's own
    if libm:
        extra["LD_PRELOAD"] = libm
    proc = run_probe(tmp_path, extra)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["allocator"] == "jemalloc"
    assert out["exec_malloc_conf"] == "narenas:3"
    assert out["env_malloc_conf"] == "narenas:3"
    if "LD_PRELOAD" in extra:
        assert out["exec_preload"] == f"{JEMALLOC}:{libm}"
        assert out["env_preload"] == libm


@linux_only
def test_missing_library_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(allocator.SEARCH_PATH_ENV, str(tmp_path / "nowhere"))
    assert find_jemalloc() is None
    with pytest.raises(ConfigError) as info:
        reexec_with_jemalloc(["refork", "app:wsgi"])
    assert str(info.value) == (
        "jemalloc not found: install it with `apt-get install libjemalloc2` (or drop --allocator jemalloc)"
    )


@linux_only
def test_missing_library_in_a_subprocess(tmp_path: Path) -> None:
    proc = run_probe(tmp_path, {allocator.SEARCH_PATH_ENV: "/nonexistent"})
    assert proc.returncode != 0
    assert "ConfigError: jemalloc not found: install it with `apt-get install libjemalloc2`" in proc.stderr


def test_search_path_override_accepts_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    monkeypatch.setenv(allocator.SEARCH_PATH_ENV, os.pathsep.join(["/nonexistent", str(tmp_path)]))
    assert find_jemalloc() == str(lib)
    monkeypatch.setenv(allocator.SEARCH_PATH_ENV, str(lib))
    assert find_jemalloc() == str(lib)


@linux_only
def test_no_exec_loop_when_preload_does_not_take(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REFORK_ALLOCATOR_REEXEC", "1")
    with pytest.raises(ConfigError, match="not loaded after re-exec"):
        reexec_with_jemalloc(["refork", "app:wsgi"])
    assert "REFORK_ALLOCATOR_REEXEC" not in os.environ


def test_malloc_trim_returns_a_bool() -> None:
    junk = [bytes(200_000) for _ in range(50)]
    del junk
    assert isinstance(malloc_trim(), bool)


_THRESHOLDS = """
import os, sys
from refork.memory.allocator import fix_glibc_thresholds
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmRSS:"))
fixed = sys.argv[1] == "fix" and fix_glibc_thresholds()
big = bytearray(16 << 20); big[::4096] = b"x" * len(big[::4096]); del big  # mmapped, freed
before = rss()
block = bytearray(12 << 20); block[::4096] = b"x" * len(block[::4096]); del block
print(fixed, (rss() - before) >> 20)
"""


@pytest.mark.parametrize("fix", [True, False], ids=["fixed", "glibc-default"])
def test_fixed_glibc_thresholds_give_a_freed_big_buffer_back(fix: bool) -> None:
    """glibc alone raises its thresholds past a freed 16 MiB block: a 12 MiB buffer freed next stays
    in the heap. With refork's thresholds it goes back to the OS at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}
    out = subprocess.run([sys.executable, "-c", _THRESHOLDS, "fix" if fix else "keep"], env=env,
                         capture_output=True, text=True, timeout=30, check=True).stdout.split()  # fmt: skip
    fixed, kept = out[0] == "True", int(out[1])
    assert fixed == fix
    assert (kept < 4) if fix else (kept >= 8), out


_RELEASE = """
from refork.memory.allocator import release_free_memory
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmRSS:"))
rows = [b"%08d" % i * 1024 for i in range(8192)]  # 64 MiB of 8 KiB blocks
kept = [b"k" * 9000 for _ in range(10)]  # live, above them
del rows
before = rss()
print(release_free_memory(), (before - rss()) >> 20)
"""


@linux_only
@pytest.mark.parametrize("conf", [None, JEMALLOC_CONF, "tcache:true,dirty_decay_ms:10000"],
                         ids=["glibc", "jemalloc", "jemalloc-tcache"])  # fmt: skip
def test_release_free_memory_returns_what_lies_below_a_live_block(conf: str | None) -> None:
    """What a mold does before it forks: 64 MiB freed under a live block, which neither glibc's trim
    nor jemalloc's decay (no allocation drives it) gives back by itself, go back to the OS; under
    jemalloc also with a MALLOC_CONF of the user's that keeps thread caches and a long decay."""
    if conf is not None and JEMALLOC is None:
        pytest.skip("libjemalloc2 not installed")
    own = ("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    if conf is not None:
        env.update(LD_PRELOAD=str(JEMALLOC), MALLOC_CONF=conf)
    out = subprocess.run([sys.executable, "-c", _RELEASE], env=env,
                         capture_output=True, text=True, timeout=30, check=True).stdout.split()  # fmt: skip
    how, released = " ".join(out[:-1]), int(out[-1])
    assert how == ("malloc_trim" if conf is None else "jemalloc purge")
    assert released >= 48, out


def test_trimmer_is_rate_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(allocator, "malloc_trim", lambda: calls.append(1) or True)
    trimmer = MallocTrimmer(min_interval=10.0)
    assert trimmer.maybe_trim(100.0)
    assert not trimmer.maybe_trim(105.0)
    assert not trimmer.maybe_trim(109.9)
    assert trimmer.maybe_trim(110.0)
    assert not trimmer.maybe_trim(111.0)
    assert len(calls) == 2


def test_a_flood_is_trimmed_at_its_ebb_and_again_once_what_it_left_has_gone() -> None:
    """The ebb's trim comes while the flood's last connections still go; one more trim follows at
    the first tick on which nothing held fell any more, and none after it until the next flood."""
    trims: list[int] = []
    flood = FloodTrim(lambda: trims.append(1))
    assert not flood.tick(False, (30, 1 << 20))  # the flood: no ebb yet
    assert flood.tick(True, (7, 0)) and len(trims) == 1  # connections fell to a quarter
    assert not flood.tick(False, (3, 0))  # still going
    assert not flood.tick(False, (0, 0))
    assert flood.tick(False, (0, 0)) and len(trims) == 2  # gone: trimmed once more
    assert not flood.tick(False, (0, 0)) and not flood.tick(False, (5, 100))
    assert len(trims) == 2


def test_memray_missing_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "memray", None)  # makes `import memray` raise ImportError
    with pytest.raises(ConfigError, match=r"--memray needs memray: pip install 'refork\[memray\]'"):
        profiling.start_memray(str(tmp_path), os.getpid())


def test_memray_capture_per_worker(tmp_path: Path) -> None:
    pytest.importorskip("memray", reason="memray not installed (pip install memray)")
    code = textwrap.dedent(
        """
        import os, sys
        from refork.memory.profiling import start_memray, stop_memray
        d = sys.argv[1]
        pid = os.fork()
        if pid == 0:
            tracker = start_memray(d, os.getpid())
            data = [bytes(1000) for _ in range(1000)]
            stop_memray(tracker)
            os._exit(0)
        assert os.waitpid(pid, 0)[1] == 0
        print(pid)
        """
    )
    out_dir = tmp_path / "captures"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(out_dir)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout)
    capture = out_dir / f"refork-worker-{pid}.bin"
    assert capture.stat().st_size > 0
    # A recycled pid does not overwrite an earlier capture.
    assert profiling._output_path(str(out_dir), pid).endswith(f"refork-worker-{pid}.1.bin")


_FILL = """
from refork.memory.allocator import fill_free_chunks
rows = [b"%08d" % i * 1024 for i in range(2048)]  # 16 MiB of 8 KiB blocks
kept = rows[::2]  # and every other one freed: 8 MiB of free chunks between live blocks
del rows
top = max(map(id, kept))
taken = fill_free_chunks() >> 20
fresh = [b"f" * 8000 for _ in range(100)]
print(taken, sum(id(block) < top for block in fresh))
"""


@linux_only
def test_filled_free_chunks_leave_new_blocks_no_room_among_the_old_ones() -> None:
    """What the monitor does before it forks a mold: the glibc heap's free chunks are taken, so that
    the mold's allocations land above the monitor's blocks, not on pages the two share."""
    own = ("MALLOC_", "GLIBC_TUNABLES", "LD_PRELOAD")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    out = subprocess.run([sys.executable, "-c", _FILL], env=env,
                         capture_output=True, text=True, timeout=30, check=True).stdout.split()  # fmt: skip
    taken, among_old = int(out[0]), int(out[1])
    assert taken >= 7 and among_old == 0, out


_PYMALLOC = """
from refork.memory.allocator import fill_pymalloc_blocks, free_pymalloc_blocks
def free():
    return sum(size * count for size, count in free_pymalloc_blocks()) >> 10
rows = [b"%06d" % i * 8 for i in range(40000)]  # 40,000 objects of 96 bytes
del rows[::2]  # and every other one freed: ~1.8 MiB of free blocks in the pools in use
before = free()
padding = fill_pymalloc_blocks()
print(before, free())
"""


def test_filled_pymalloc_blocks_leave_the_pools_in_use_full() -> None:
    """What the monitor does before it forks a mold: the free blocks of pymalloc's pools in use are
    taken, so that the mold's small objects go to fresh pools, not to pages the two share."""
    out = subprocess.run([sys.executable, "-c", _PYMALLOC],
                         capture_output=True, text=True, timeout=30, check=True).stdout.split()  # fmt: skip
    before, after = int(out[0]), int(out[1])
    assert before >= 1500 and after <= 200, out
