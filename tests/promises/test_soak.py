"""Soak and chaos runs: slow, bounded in time, run in CI with `-m slow`."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from conftest import pids_alive
from support.load import Load
from support.mixed_load import MixedLoad
from support.request_paths import PATHS, flags, http2

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


@pytest.mark.parametrize("path", ["engine", "uvloop", "python-4-h2c"])
def test_mixed_load_through_default_reforks_fails_nothing(start_server, path):
    """Keep-alive GETs, 1 MB uploads, slow streams and (ASGI) 20 echoing WebSockets while the
    defaults refork (workers retire, molds are promoted): no request fails, no WebSocket closes.
    The 60 s run on every path is benchmarks/mixed_load.py."""
    path_flags, app = flags(path, "apps.mixed_load")
    server = start_server(*path_flags, app=app, defaults=True)
    websockets = 20 if PATHS[path][0] == "asgi" else 0
    with MixedLoad(server.port, http2=http2(path), websockets=websockets) as load:
        # the defaults' three reforks (50, 100, 1000 requests: generations 1 to 3), then as many
        # requests again as carried them, 10 more slow streams and 10 s more of echoes: the retiring
        # workers' last requests, their WebSockets kept open, their successors' first requests
        server.wait_for(lambda: (s := server.status())["generation"] >= 3 and not s["refork_pending"],
                        timeout=60, what="three reforks")  # fmt: skip
        load.wait_for(sum(load.ok.values()), streams=10, messages=websockets * 10, timeout=60)
    assert load.failures == {}, (load.summary(), load.examples)
    assert load.ws_closes == {}, (load.summary(), load.examples)
    assert min(load.ok[kind] for kind in ("get", "upload")) > 0 and load.ok["stream"] >= 10, load.summary()
    assert load.ws_messages >= websockets * 10, load.summary()


KILLS = 30
SETTLED = 1.5  # seconds: a process that dies younger counts as a crash loop and backs off (up to 30 s)


def test_chaos_killing_workers_and_molds_recovers(start_server):
    """Random SIGKILLs to settled workers and molds under load and reforks; full strength after.

    Victims are processes seen alive for SETTLED seconds: killing newborns is a crash loop, whose
    back-off (up to 30 s, tests/process/test_supervisor.py) would make this run's length a matter of luck.
    Reforks come from USR2 every few kills, not --refork-after, whose pace is the machine's speed.
    """
    server = start_server(workers=3)
    rng = random.Random(7)
    deadline = time.monotonic() + 90  # a bound, not a measure: it stops after KILLS kills
    kills = 0
    first_seen: dict[int, float] = {}
    with Load(server.port, threads=4) as load:
        while kills < KILLS and time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                processes = server.status()["processes"]
            except OSError:
                continue
            now = time.monotonic()
            for p in processes:
                first_seen.setdefault(p["pid"], now)
            settled = [p for p in processes if now - first_seen[p["pid"]] >= SETTLED]
            if not settled:
                continue
            victim = rng.choice(settled)
            try:
                os.kill(victim["pid"], signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
            if kills % 4 == 0:
                server.signal(signal.SIGUSR2)  # refork (refused while a mold is missing or coming)
    assert kills == KILLS, server.log()
    server.wait_for(lambda: len(server.workers()) == 3 and server.mold() is not None, timeout=30,
                    what="full strength after the chaos")
    for _ in range(20):
        assert server.get("/")[0] == 200
    # Requests in flight on a killed worker fail; everything else must have been served.
    assert load.ok > 20 * len(load.failures), (load.ok, load.failures[:5])
