"""The monitor's own heap: prepared before its first fork, immortalized only after a canary
survived doing so (real forks, in a child interpreter)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from refork.memory.heap import immortalize_support

SUPPORTED, WHY = immortalize_support()


def prepare(setup: str = "") -> str:
    code = (
        "import os, signal\n"
        "from refork.process import monitor_heap\n"
        f"{setup}\n"
        "print(monitor_heap.prepare_monitor_heap(True))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(not SUPPORTED, reason=f"no immortalization here: {WHY}")
def test_a_canary_that_survives_lets_the_monitor_immortalize_its_heap():
    assert prepare().startswith("(True, 'immortalize on (")


@pytest.mark.skipif(not SUPPORTED, reason=f"no immortalization here: {WHY}")
def test_a_canary_killed_by_a_signal_keeps_the_monitor_from_immortalizing():
    crash = "monitor_heap._work = lambda: os.kill(os.getpid(), signal.SIGSEGV)"
    assert prepare(crash) == "(False, 'the immortalization canary was killed by SIGSEGV')"


def test_where_immortalization_is_unsupported_the_monitor_only_freezes():
    if SUPPORTED:
        setup = "from refork.memory import heap\nmonitor_heap.immortalize_support = lambda: (False, 'x')"
        assert prepare(setup).startswith("(True, 'frozen ")
    else:
        assert prepare().startswith("(True, 'frozen ")
