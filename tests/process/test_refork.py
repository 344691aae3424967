"""Reforking from warm workers, fork-unsafe marking, memory accounting and recycling."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from conftest import ROOT, pids_alive
from support.load import Load
from support.request_paths import PATHS, every_path, flags, http2, tls


def status_cli(server, *flags: str) -> subprocess.CompletedProcess:
    """`refork status` run the way a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "refork", "status", *flags, "--control-socket", server.control],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )


def generations(server) -> set[int]:
    return {w["generation"] for w in server.workers(state=None)}


def test_refork_after_promotes_at_the_configured_counts_without_failures(start_server):
    server = start_server("--refork-after", "30,60,off", workers=2)
    assert server.status()["generation"] == 0
    with Load(server.port, threads=3) as load:
        server.wait_for(
            lambda: (
                server.status()["generation"] >= 1
                and min(generations(server)) >= 1  # gen 2 may follow before a poll sees gen 1 alone
                and len(server.workers()) == 2
            ),
            timeout=30,
            what="generation 1 (or later) everywhere",
        )
        server.wait_for(
            lambda: (
                server.status()["generation"] >= 2
                and generations(server) == {2}
                and len(server.workers()) == 2
            ),
            timeout=30,
            what="generation 2 everywhere",
        )
    assert load.failures == []
    log = server.log()
    assert "reached 30 requests" in log  # gen-0 workers are promoted at the first count
    assert "reached 60 requests" in log  # gen-1 workers at the second
    mold = server.mold()
    with open(f"/proc/{mold['pid']}/cmdline", "rb") as f:
        assert f.read().split(b"\0")[0] == f"refork: mold (gen {mold['generation']})".encode()


def test_usr2_and_refork_command_trigger_a_refork(start_server):
    server = start_server(workers=2)
    for _ in range(10):
        server.get("/")
    server.signal(signal.SIGUSR2)
    server.wait_for(
        lambda: (
            server.status()["generation"] == 1 and generations(server) == {1} and len(server.workers()) == 2
        ),
        what="refork after USR2",
    )
    result = subprocess.run(
        [sys.executable, "-m", "refork", "refork", "--control-socket", server.control],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    server.wait_for(
        lambda: server.status()["generation"] == 2 and generations(server) == {2},
        what="refork after `refork refork`",
    )


def test_mark_fork_unsafe_is_honoured(start_server):
    server = start_server("--refork-after", "5", workers=1)
    assert server.get("/unsafe") == (200, b"marked")
    for _ in range(20):
        assert server.get("/")[0] == 200
    worker = server.wait_for(lambda: [w for w in server.workers() if w["fork_unsafe"]], what="unsafe mark")[0]
    assert "opened a connection" in worker["fork_unsafe"]
    assert server.status()["generation"] == 0
    result = server.request("refork")
    assert result["ok"] is False
    assert server.status()["generation"] == 0
    table = status_cli(server).stdout
    assert "fork-unsafe: opened a connection at request time" in table


def test_mold_idle_exit_stops_the_mold_and_promotes_a_worker_when_one_is_needed(start_server):
    server = start_server("--mold-idle-exit", "0.3", workers=2)
    # the mold may already be gone by the first status read (0.3 s idle): take its pid from its log line
    first_mold = int(re.search(r"\[(\d+)\] \[INFO\] mold \(gen 0\) ready", server.log()).group(1))
    server.wait_for(lambda: server.status()["mold_shed"], what="the idle mold to stop")
    assert server.mold() is None and pids_alive([first_mold]) == []
    assert "(mold stopped while idle)" in status_cli(server).stdout
    with Load(server.port, threads=2) as load:
        load.wait_until_warm()  # a request on a fresh connection to the victim would be lost
        victim = server.workers()[0]
        os.kill(victim["pid"], signal.SIGKILL)
        replacement = server.wait_for(
            lambda: [w for w in server.workers() if w["nr"] == victim["nr"] and w["pid"] != victim["pid"]],
            timeout=15,
            what="a replacement worker forked by a promoted worker",
        )[0]
        server.wait_for(lambda: server.status()["mold_shed"], what="the summoned mold to stop again")
    assert load.failures == []
    assert replacement["generation"] == 0  # a summoned mold keeps the generation: no rollout
    with open(f"/proc/{replacement['pid']}/stat") as f:
        assert int(f.read().split(")")[1].split()[1]) == server.proc.pid
    log = server.log()
    assert "a worker is needed and the mold was stopped while idle" in log
    assert "promoted to mold of gen 0" in log
    assert "from a fresh import" not in log
    assert server.get("/")[0] == 200
    server.signal(signal.SIGTTOU)  # fewer workers needs no mold
    server.wait_for(lambda: len(server.workers(state=None)) == 1, what="one worker after TTOU")
    assert server.status()["mold_shed"]
    server.signal(signal.SIGTTIN)  # more does: a worker is promoted again
    server.wait_ready(2)


def test_without_mold_idle_exit_the_mold_stays(start_server):
    server = start_server(workers=1)
    mold = server.mold()["pid"]
    server.get("/")
    time.sleep(1.0)  # (the input, not a wait) idle longer than --mold-idle-exit auto's 1 s: nothing happens
    assert server.mold()["pid"] == mold and not server.status()["mold_shed"]


def test_memory_limit_recycles_a_growing_worker(start_server):
    server = start_server("--max-worker-memory", "150M", "--memory-interval", "0.2", workers=1)
    victim = server.workers()[0]["pid"]
    assert server.get("/grow?200000000")[0] == 200
    server.wait_for(
        lambda: (w := server.workers()) and w[0]["pid"] != victim,
        timeout=20,
        what="replacement of the big worker",
    )
    assert "over --max-worker-memory" in server.log()
    assert server.get("/")[0] == 200


def test_status_reports_per_process_memory(start_server):
    server = start_server(workers=2)
    server.get("/")
    status = server.status()
    assert status["total_pss"] > 0
    for process in status["processes"]:
        for key in ("rss", "pss", "uss", "private_dirty", "minflt"):
            assert process[key] is not None and process[key] >= 0, (key, process)
        assert process["uss"] <= process["rss"]
    result = status_cli(server, "--json")
    assert json.loads(result.stdout)["monitor_pid"] == server.proc.pid
    table = status_cli(server).stdout
    assert "PSS" in table and "worker 1" in table and "mold" in table


def test_status_says_how_much_a_worker_shares_and_why_it_holds_memory_of_its_own(start_server):
    server = start_server("--memory-interval", "0.5", workers=1)
    worker = server.workers()[0]
    server.wait_for(lambda: server.workers()[0].get("shared"), what="a first memory sample")

    def grown() -> dict | None:
        """20 more requests that each keep 200 KB (the app keeps memory per request); the row once
        a sample has seen 100 of them since the worker's first sample, and the worker's own memory
        is clearly over half its resident memory (the note's threshold, PRIVATE_HEAVY)."""
        for _ in range(20):
            assert server.get("/grow?200000")[0] == 200
        row = server.workers()[0]
        heavy = row["uss"] is not None and row["uss"] > 0.6 * row["rss"]
        return row if heavy and (row["private_per_request"] or 0) > 50_000 else None

    row = server.wait_for(grown, timeout=60, what="the growth per request measured")
    assert row["pid"] == worker["pid"] and 0 < row["shared"] < row["rss"]
    table = status_cli(server).stdout
    assert "SHARED" in table.splitlines()[2] and "a request: the app keeps memory per request" in table


def test_jemalloc_flag_loads_jemalloc(start_server):
    server = start_server("--allocator", "jemalloc", workers=1)
    assert server.status()["allocator"] == "jemalloc"
    worker = server.workers()[0]["pid"]
    with open(f"/proc/{worker}/maps") as f:
        assert "libjemalloc" in f.read()
    assert server.get("/")[0] == 200
    assert "MALLOC_CONF" not in os.environ


def test_warmup_runs_in_the_mold_before_fork(start_server, tmp_path):
    server = start_server("--warmup", "/", "--warmup", "/sleep?0", workers=1)
    assert "warm-up: / 200, /sleep?0 200 (2 passes" in server.log()


def test_warmup_sends_each_path_twice_so_3_12_specializes_in_the_mold(start_server):
    server = start_server("--warmup", "/count", workers=1)
    assert server.get("/count") == (200, b"3")  # the worker inherits the mold's two warm-up runs


def test_memray_writes_one_capture_per_worker(start_server, tmp_path):
    import pytest

    pytest.importorskip("memray")
    out = tmp_path / "memray"
    server = start_server("--memray", str(out), workers=2)
    pids = {w["pid"] for w in server.workers()}
    for _ in range(5):
        server.get("/")
    assert {w["fork_unsafe"] for w in server.workers()} == {"--memray tracker running"}
    server.signal(signal.SIGTERM)
    assert server.wait_exit(30) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(f"refork-worker-{pid}.bin" for pid in pids)
    assert all((out / name).stat().st_size > 0 for name in files)


@every_path
def test_a_refork_under_a_steady_stream_of_short_requests_is_never_stuck(start_server, path):
    """Requests overlap so that one is always in flight: the worker being promoted holds the new
    ones until those in flight end and it forks, or declines within a few seconds (a loop that
    cannot hold them: ASGI's HTTP/2 streams) and says so."""
    chosen, app = flags(path, "apps.promises")
    server = start_server(*chosen, "--refork-after", "off", app=app, workers=1)
    loads = [Load(server.port, path=f"/sleep?{pause}", threads=4, http2=http2(path), tls=tls(path))
             for pause in (0.3, 0.37)]  # fmt: skip  (two paces: their requests never all end at once)
    with loads[0], loads[1]:
        loads[0].wait_for_requests(12)
        server.signal(signal.SIGUSR2)
        outcome = server.wait_for(
            lambda: re.search(r"(not )?promoted to mold of gen 1", server.log()),
            timeout=10,
            what="the promotion taken or declined",
        )
        held = PATHS[path][0] == "wsgi" or not http2(path)  # (ASGI's HTTP/2 streams are not held)
        assert outcome.group(1) is None or not held, server.log()
        loads[0].wait_for_requests(12)
    assert loads[0].failures == loads[1].failures == []
