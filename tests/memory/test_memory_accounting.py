"""/proc-based accounting: sane values, USS growth in a child, size formatting."""

from __future__ import annotations

import os

import pytest
from support.waits import process_state, wait_until

from refork.config import parse_size
from refork.memory.accounting import format_bytes, read_memory

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux /proc")
MiB = 1 << 20


def test_read_memory_of_self_is_sane() -> None:
    m = read_memory(os.getpid())
    assert m is not None
    assert m.pid == os.getpid()
    assert 5 * MiB < m.rss < 64 * 1024 * MiB
    assert 0 < m.pss <= m.rss
    assert 0 < m.uss <= m.rss
    assert 0 < m.private_dirty <= m.uss
    assert m.shared + m.uss == pytest.approx(m.rss, rel=0.01)
    assert m.swap >= 0
    assert m.minflt > 0


def test_gone_and_zombie_processes_read_as_none() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    wait_until(lambda: process_state(pid) == "Z", what="a zombie")  # exited, not reaped yet
    try:
        assert read_memory(pid) is None
    finally:
        os.waitpid(pid, 0)
    assert read_memory(pid) is None


def test_child_touching_memory_shows_uss_growth() -> None:
    to_child_r, to_child_w = os.pipe()
    to_parent_r, to_parent_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(to_child_r, 1)
        block = bytearray(64 * MiB)
        for i in range(0, len(block), 4096):
            block[i] = 1
        os.write(to_parent_w, b"t")
        os.read(to_child_r, 1)
        os._exit(0)
    try:
        before = read_memory(pid)
        os.write(to_child_w, b"g")
        os.read(to_parent_r, 1)
        after = read_memory(pid)
        assert before is not None and after is not None
        assert after.uss - before.uss >= 60 * MiB
        assert after.private_dirty - before.private_dirty >= 60 * MiB
        assert after.minflt - before.minflt >= 60 * MiB // 4096 * 0.9
    finally:
        os.write(to_child_w, b"x")
        os.waitpid(pid, 0)


def test_fresh_child_starts_sharing() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(r, 1)
        os._exit(0)
    try:
        m = read_memory(pid)
        assert m is not None
        assert m.shared > m.uss  # just forked: nearly everything is still the parent's
        assert m.minflt < 5000  # the counter starts at fork
    finally:
        os.write(w, b"x")
        os.waitpid(pid, 0)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0B"),
        (900, "900B"),
        (1024, "1.0K"),
        (300 * 1024, "300.0K"),
        (512 << 20, "512.0M"),
        (3 << 29, "1.5G"),
        (5 << 40, "5.0T"),
        (-(2 << 20), "-2.0M"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_round_trip() -> None:
    for text in ("512.0M", "1.5G", "300.0K"):
        assert format_bytes(parse_size(text)) == text
