"""refork/_native.pyi, the types mypy checks every call into the Rust extension against, says what
the built module has: mypy's stubtest imports refork._native and compares each public name of the
stub with it (present, a class or a function, the same parameters by name, kind and default) and
every public name of the module with the stub.
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
