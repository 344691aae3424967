"""refork/_native.pyi, the types mypy checks every call into the Rust extension against, says what
the built module has: mypy's stubtest imports refork._native and compares each public name of the
stub with it (present, a class or a function, the same parameters by name, kind and default) and
every public name of the module with the stub. And mypy, with the stub, refuses a wrong argument
on either side of the seam (a call into an engine, or an engine's HandOver to its host).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import paths

ROOT = paths.ROOT


def test_the_stub_matches_the_built_module(tmp_path: Path) -> None:
    env = {**os.environ, "MYPY_CACHE_DIR": str(tmp_path / "mypy-cache")}
    cmd = [sys.executable, "-m", "mypy.stubtest", "refork._native"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Success" in out.stdout, out.stdout


SEAM = '''\
from refork import _native
from refork.process.worker import Worker
from refork.serving.wsgi.engine_host import EngineHost
from refork.serving.wsgi.native_host import refs
from refork.serving.wsgi.pool_host import PoolHost


def right(host: EngineHost, pool: PoolHost, engine: _native.Engine, h: _native.HandOver) -> bool:
    engine.adopt(h.fd, h.client, h.listener_fd, 0.0)
    host.finish_response(h)
    return pool.finish_response(h)


def wrong(host: EngineHost, pool: PoolHost, engine: _native.Engine, h: _native.HandOver) -> None:
    engine.adopt(str(h.fd), h.client, h.listener_fd, 0.0)  # line 15: an fd is an int
    host.finish_response(h.fd)  # line 16: one HandOver, not its parts
    engine.run(1.0)  # line 17: keep_alive missing
    _native.Engine(pool, [], refs())  # line 18: a pool host is not an engine's host


def clocked(worker: Worker) -> _native._ClockedControl:
    return worker  # what the engine reads of a worker's control and its clock
'''


def test_a_wrong_argument_across_the_seam_fails_mypy(tmp_path: Path) -> None:
    """The stub and refork.serving.contract.HandOverHost type both directions of the Rust/Python
    seam: a call with a wrong argument fails mypy --strict, the right calls pass."""
    snippet = tmp_path / "seam.py"
    snippet.write_text(SEAM)
    env = {**os.environ, "MYPY_CACHE_DIR": str(tmp_path / "mypy-cache")}
    cmd = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", str(snippet)]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    lines = {int(line.split(":")[1]) for line in out.stdout.splitlines() if ": error:" in line}
    assert lines == {15, 16, 17, 18}, out.stdout + out.stderr
