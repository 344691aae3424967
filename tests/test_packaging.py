"""`pip wheel .` builds a wheel that installs and runs: what docs/deploy.md's Dockerfile does."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from support import paths

ROOT = paths.ROOT


def test_pip_wheel_builds_an_installable_wheel(tmp_path):
    dist, target = tmp_path / "dist", tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("refork-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("refork/memory/_immortal") for n in names)
    assert any(n.startswith("refork/_native") for n in names)  # cargo is on this machine
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    check = (
        "import refork, refork._native, refork.memory._immortal, refork.cli\n"
        "print(refork.__file__)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip().startswith(str(target))  # the installed copy, not the checkout
    version = subprocess.run(
        [sys.executable, "-m", "refork", "--version"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path,
    )  # fmt: skip
    assert version.returncode == 0 and version.stdout.startswith("refork ")
