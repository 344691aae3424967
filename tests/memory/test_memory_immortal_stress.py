"""An immortalized heap under stress, in forked workers and in the mold (tests/apps/immortal_stress.py).

A mold-like process imports a good part of the standard library and a call-heavy app
(tests/apps/callheavy.py), warms them up and prepares its heap as refork's mold does. Each
scenario then runs in a forked child that ends with a normal interpreter shutdown, and in the
parent: the garbage collector, threads, containers of immortal objects freed, exceptions,
generators and coroutines, 100k+ specializing calls, a refork of a refork. After each, the
shared objects must still carry the immortal header CPython itself writes, and the app must
compute what it did before the fork. Where immortalization is unsupported (3.10, 3.11) the
same runs check the fork discipline alone and the reason given.
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from support import paths

from refork.memory import heap

APPS = paths.TESTS / "apps"
SCENARIOS = ["gc", "threads", "exceptions", "generators", "calls", "refork", "shutdown", "free"]


def run_stress(*scenarios: str, flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, str(APPS / "immortal_stress.py"), *scenarios],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=APPS,
    )


def explain(proc: subprocess.CompletedProcess[str]) -> str:
    if proc.returncode < 0:
        how = f"the mold-like process was killed by {signal.Signals(-proc.returncode).name}"
    else:
        how = f"exit status {proc.returncode}"
    return f"{how}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def check_run(proc: subprocess.CompletedProcess[str], scenarios: list[str]) -> list[str]:
    assert proc.returncode == 0, explain(proc)
    lines = proc.stdout.splitlines()
    if sys.version_info >= (3, 12):
        assert lines[0].startswith("immortalize on ("), lines[0]
    else:
        assert lines[0] == f"immortalize unsupported: Python 3.{sys.version_info[1]} (needs CPython 3.12+)"
    for name in scenarios:
        assert f"ok {name} child" in lines, explain(proc)
        assert f"ok {name} parent" in lines, explain(proc)
    for bad in ("Traceback", "Fatal Python error", "Exception ignored", "Warning"):
        assert bad not in proc.stderr, explain(proc)
    return lines


def test_support_on_this_interpreter() -> None:
    """Supported on every GIL CPython 3.12-3.15; on 3.10 and 3.11 the reason says why not."""
    ok, reason = heap.immortalize_support()
    if sys.version_info >= (3, 12):
        assert ok, reason
    else:
        assert not ok
        assert reason == f"Python 3.{sys.version_info[1]} (needs CPython 3.12+)"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_immortal_heap_under_stress(scenario: str) -> None:
    lines = check_run(run_stress(scenario), [scenario])
    if scenario == "refork":
        for name in ("gc", "threads", "exceptions", "generators", "calls", "free"):
            assert f"ok {name} grandchild" in lines
    if scenario == "shutdown":  # the exit handlers ran, with the shared heap still intact
        assert "atexit child True" in lines and "atexit parent True" in lines


@pytest.mark.parametrize("flags", [(), ("-X", "dev")], ids=["plain", "dev-mode"])
def test_every_scenario_in_one_worker(flags: tuple[str, ...]) -> None:
    """One child runs them all in turn and shuts down; -X dev adds the debug hooks of the
    allocator, faulthandler and every warning."""
    lines = check_run(run_stress("all", flags=flags), SCENARIOS)
    assert lines.count("atexit child True") == 1 and "atexit parent True" in lines


def test_a_worker_killed_by_a_signal_fails_the_run() -> None:
    """The negative control: a child that dies by SIGSEGV is named, and fails the run."""
    proc = run_stress("segfault")
    assert proc.returncode == 1, explain(proc)
    assert "child running segfault was killed by SIGSEGV" in proc.stderr
