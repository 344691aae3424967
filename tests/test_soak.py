"""Soak and chaos runs: slow, bounded in time, run in CI with `-m slow`."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from conftest import pids_alive
from load import Load

pytestmark = pytest.mark.slow


def test_soak_reforks_recycling_reloads_and_scaling_lose_no_request(start_server):
    server = start_server("--refork-after", "150,300", "--max-requests", "400", "--max-requests-jitter", "50",
                          "--threads", "2", workers=3)
    deadline = time.monotonic() + 25
    actions = [signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR2]
    with Load(server.port, threads=6) as load:
        step = 0
        while time.monotonic() < deadline:
            time.sleep(2.5)
            server.signal(actions[step % len(actions)])
            step += 1
    status = server.wait_for(lambda: (s := server.status()) and not s["refork_pending"] and s, what="quiet")
    assert load.failures == []
    assert load.ok > 1000
    assert status["generation"] >= 3
    children = [p["pid"] for p in status["processes"]]
    server.signal(signal.SIGTERM)
    assert server.wait_exit(60) == 0
    assert pids_alive(children) == []


KILLS = 30


def test_chaos_killing_workers_and_molds_recovers(start_server):
    server = start_server("--refork-after", "200", workers=3)
    rng = random.Random(7)
    deadline = time.monotonic() + 60  # a bound, not a measure: it stops after KILLS kills
    kills = 0
    with Load(server.port, threads=4) as load:
        while kills < KILLS and time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                processes = server.status()["processes"]
            except OSError:
                continue
            if not processes:
                continue
            victim = rng.choice(processes)
            try:
                os.kill(victim["pid"], signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
    assert kills == KILLS
    server.wait_for(lambda: len(server.workers()) == 3 and server.mold() is not None, timeout=30,
                    what="full strength after the chaos")
    for _ in range(20):
        assert server.get("/")[0] == 200
    # Requests in flight on a killed worker fail; everything else must have been served.
    assert load.ok > 20 * len(load.failures), (load.ok, load.failures[:5])
