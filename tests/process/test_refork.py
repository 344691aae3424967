"""Reforking from warm workers, fork-unsafe marking, memory accounting and recycling."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import h2.config
import h2.connection
import h2.events
import pytest
from conftest import ROOT, pids_alive
from support.load import Load
from support.request_paths import PATHS, connect, every_path, flags, http2, tls


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


class Idle:
    """A connection that has carried one response and stays open (an HTTP/2 one: its stream ended)."""

    def __init__(self, server, path: str) -> None:
        self.sock = connect(path, server.port, alpn="h2" if http2(path) else "http/1.1")
        self.h2: h2.connection.H2Connection | None = None
        if http2(path):
            self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
            self.h2.initiate_connection()
            self.sock.sendall(self.h2_get(1))
            ended = False
            while not ended:
                data = self.sock.recv(65536)
                assert data, "closed before its first response"
                ended = any(isinstance(e, h2.events.StreamEnded) for e in self.h2.receive_data(data))
            self.sock.sendall(self.h2.data_to_send())
            return
        self.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while not re.search(rb"\r\n\r\n\d+ \d+$", received):  # ("PID PPID", the app's answer to /)
            data = self.sock.recv(65536)
            assert data, "closed before its first response"
            received += data

    def h2_get(self, sid: int) -> bytes:
        assert self.h2 is not None
        fields = [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "x")]
        self.h2.send_headers(sid, fields, end_stream=True)
        return self.h2.data_to_send()

    def next_request(self, upload: int = 0) -> bytes | OSError:
        """Send the next request (HTTP/1.1: with an `upload` the app does not read) and read until
        the server closes: what came, or the error (a reset: a close with input of ours unread)."""
        if self.h2 is not None:
            request = self.h2_get(3)
        elif upload:
            request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % upload + b"x" * upload
        else:
            request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        received = b""
        try:
            self.sock.sendall(request)
            while data := self.sock.recv(65536):
                received += data
        except OSError as e:
            return e
        finally:
            self.sock.close()
        return received


@every_path
@pytest.mark.parametrize("retirement", ["max-requests", "refork"])
def test_a_keep_alive_client_idle_on_a_retiring_worker_meets_an_answer_or_a_clean_eof(
    start_server, path, retirement
):
    """Clients idle on a worker that retires send their next request while it drains (an upload it
    answers without reading) and after it is gone: each gets its response (with Connection: close)
    or a clean EOF it may retry on, never a reset (a close with their bytes unread)."""
    chosen, app = flags(path, "apps.promises")
    extra = ["--max-requests", "7", "--max-requests-jitter", "0"] if retirement == "max-requests" else []
    server = start_server(*chosen, "--refork-after", "off", *extra, app=app, workers=1)
    (old,) = [w["pid"] for w in server.workers()]
    idle = [Idle(server, path) for _ in range(6)]
    if retirement == "refork":
        server.signal(signal.SIGUSR2)
    else:
        Idle(server, path).sock.close()  # (the seventh request)
    server.wait_for(lambda: [w for w in server.workers(state="stopping") if w["pid"] == old],
                    what="the retiring worker draining")  # fmt: skip
    draining: list[bytes | OSError] = []
    uploads = [threading.Thread(target=lambda c=c: draining.append(c.next_request(1 << 20)))
               for c in idle[:3]]  # fmt: skip
    for t in uploads:
        t.start()
    for t in uploads:
        t.join(30)
    server.wait_for(lambda: not pids_alive([old]), what="the retired worker gone")
    after = [c.next_request() for c in idle[3:]]
    assert not [r for r in draining + after if isinstance(r, OSError)], (draining, after)
