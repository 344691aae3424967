"""Prometheus metrics (--metrics-bind): the renderer, the slot counters, the supervisor's restart
causes, and real servers scraped by curl-like clients, promtool and a real Prometheus server."""

from __future__ import annotations

import http.client
import json
import math
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import free_port
from support.supervisor_sim import KILLED, Sim, of
from support.waits import accept_queue, served_connections, wait_until

from refork.config import ConfigError
from refork.config import coercers as c
from refork.memory.accounting import ProcessMemory
from refork.process import messages
from refork.process.listen_queue import listen_queue
from refork.process.metrics import CONTENT_TYPE, ListenerSample, Snapshot, Totals, WorkerSample, render
from refork.process.slots import DEFAULT_BUCKETS, AppClock, Slots
from refork.process.supervisor.events import ChildExited, MemorySampled, Signal, SlotReading

SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def parse(text: str) -> dict[str, float]:
    """`name{labels}` -> value, for every sample line."""
    values = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SERIES.match(line)
        assert m, line
        values[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return values


def total(values: dict[str, float], name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels`."""
    found = 0.0
    for key, value in values.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', rest))
        if all(pairs.get(k) == v for k, v in labels.items()):
            found += value
    return found


def promtool_check(text: str) -> None:
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "" and result.stderr.strip() == "", result.stdout + result.stderr


def scrape(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode()
    finally:
        conn.close()


def settled(port: int, requests: int, timeout: float = 10.0) -> tuple[str, dict[str, float]]:
    """Scrape until `requests` are counted: a worker counts a request once its answer is written,
    which may be a moment after the client read it."""
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(port)[2]
        values = parse(text)
        if values["refork_requests_total"] >= requests or time.monotonic() > deadline:
            return text, values
        time.sleep(0.05)


# -- the renderer (pure) -------------------------------------------------------------------------
def counters(slots: Slots, index: int = 0):
    return slots.counters(index)


def test_render_is_valid_exposition_with_cumulative_buckets_and_escaped_labels():
    slots = Slots(2, (0.1, 1.0))
    slots.claim(0, 11, 0.0, threads=4, started=90.0)
    clock = AppClock(slots, 0, 30.0, lambda: 100.0)
    clock.finished(clock.started("GET", b"/"), 200)  # 0 s: first bucket
    memory = ProcessMemory(11, rss=300, pss=200, uss=100, private_dirty=100, shared=0, swap=0, minflt=7)
    totals = Totals(2, requests=5, duration_sum=2.5, statuses=[0, 3, 0, 2, 0], histogram=[1, 1, 3])
    snap = Snapshot(
        bounds=slots.bounds,
        now=100.0,
        totals=totals,
        workers=[WorkerSample(0, 3, counters(slots), memory), WorkerSample(1, 3, None, None)],
        worker_states={"ready": 1, "starting": 1},
        target_workers=2,
        restarts={"crash": 2, "request_timeout": 1},
        generation=3,
        mold_state="ready",
        listeners=[ListenerSample('unix:/tmp/a"b\\c', 1, 16), ListenerSample("unix:/x", None, None)],
        commands={"status": 4},
    )
    text = render(snap)
    promtool_check(text)
    v = parse(text)
    assert v["refork_requests_total"] == 6  # 5 exited + 1 live
    assert v['refork_responses_total{code="2xx"}'] == 4 and v['refork_responses_total{code="4xx"}'] == 2
    assert v['refork_request_duration_seconds_bucket{le="0.1"}'] == 2
    assert v['refork_request_duration_seconds_bucket{le="1.0"}'] == 3
    assert v['refork_request_duration_seconds_bucket{le="+Inf"}'] == 6
    assert v["refork_request_duration_seconds_count"] == 6 and v["refork_request_duration_seconds_sum"] == 2.5
    assert v['refork_worker_restarts_total{cause="crash"}'] == 2
    assert v['refork_worker_restarts_total{cause="memory"}'] == 0  # the known causes are always there
    assert v['refork_worker_restarts_total{cause="request_timeout"}'] == 1  # an open set
    assert v['refork_mold_state{state="ready"}'] == 1 and v['refork_mold_state{state="none"}'] == 0
    assert v['refork_workers{state="starting"}'] == 1 and v["refork_generation"] == 3
    assert v['refork_listen_queue_length{listener="unix:/tmp/a\\"b\\\\c"}'] == 1  # escaped
    assert 'listener="unix:/x"' not in text  # an unknown queue is left out, not shown as 0
    assert v['refork_control_commands_total{command="status"}'] == 4
    ids = '{worker="0",generation="3"}'
    assert v["refork_worker_requests_total" + ids] == 1
    assert v["refork_worker_busy_threads" + ids] == 0 and v["refork_worker_idle_threads" + ids] == 4
    assert v["refork_worker_age_seconds" + ids] == 10.0
    assert v["refork_worker_pss_bytes" + ids] == 200 and v["refork_worker_minor_faults_total" + ids] == 7
    assert 'worker="1"' not in text  # not claimed its slot yet: no series
    assert text.count("# TYPE refork_worker_request_duration_seconds histogram") == 1


def test_render_with_no_workers_is_still_valid():
    text = render(Snapshot(bounds=DEFAULT_BUCKETS, now=0.0, totals=Totals(len(DEFAULT_BUCKETS))))
    promtool_check(text)
    assert parse(text)['refork_request_duration_seconds_bucket{le="+Inf"}'] == 0


# -- the slot counters (the worker's side) -------------------------------------------------------
def test_app_clock_counts_statuses_durations_in_flight_and_busy():
    slots = Slots(1, (0.1, 1.0))
    slots.claim(0, 1, 0.0, threads=2, started=5.0)
    now = [100.0]
    clock = AppClock(slots, 0, 30.0, lambda: now[0])
    a = clock.started("GET", b"/a")
    b = clock.started("GET", b"/b")
    read = slots.counters(0)
    assert (read.in_flight, read.busy, read.threads, read.started) == (2, 2, 2, 5.0)
    clock.waiting(b)  # waits on its client: in flight, holding no thread
    assert (slots.counters(0).in_flight, slots.counters(0).busy) == (2, 1)
    now[0] = 100.5
    clock.finished(a, 404)
    clock.resumed(b)
    now[0] = 102.0
    clock.finished(b, 200)
    read = slots.counters(0)
    assert read.requests == 2 and (read.in_flight, read.busy) == (0, 0)
    assert read.statuses == (0, 1, 0, 1, 0)
    assert read.buckets == (0, 1, 1)  # 0.5 s in (0.1, 1]; 2 s past every bound
    assert read.duration_sum == pytest.approx(2.5)
    clock.finished(clock.started(), 0)  # no status (the client went away): counted, no class
    assert slots.counters(0).statuses == (0, 1, 0, 1, 0) and slots.counters(0).requests == 3


def test_overdue_word_claim_and_release_blank_the_slot():
    slots = Slots(2)
    slots.claim(1, 42, 9.0)
    slots.set_overdue(1, 3)
    assert slots.overdue(1) == 3 and slots.counters(1).overdue == 3
    clock = AppClock(slots, 1, 30.0, lambda: 1.0)
    clock.finished(clock.started(), 500)
    slots.release(1)
    assert slots.owner(1) == 0 and slots.counters(1).requests == 0 and slots.overdue(1) == 0
    slots.set_overdue(1, 2)
    slots.claim(1, 43, 9.0)
    assert slots.overdue(1) == 0 and sum(slots.counters(1).statuses) == 0  # a new worker starts at 0


def test_totals_fold_an_exited_workers_counts():
    slots = Slots(1, (1.0,))
    slots.claim(0, 1, 0.0)
    clock = AppClock(slots, 0, 30.0, lambda: 0.0)
    for status in (200, 200, 503):
        clock.finished(clock.started(), status)
    totals = Totals(1)
    totals.fold(slots.counters(0))
    totals.fold(slots.counters(0))
    assert totals.requests == 6 and totals.statuses == [0, 4, 0, 0, 2] and totals.histogram == [6, 0]


def test_bucket_setting_is_checked():
    assert c.histogram_buckets("0.1, 1,10", "--metrics-buckets") == [0.1, 1.0, 10.0]
    for bad in ("1,0.5", "0,1", "1,1", "inf", "", ",".join(str(i) for i in range(1, 41))):
        with pytest.raises(ConfigError):
            c.histogram_buckets(bad, "--metrics-buckets")
    assert c.optional_bind_address("off", "--metrics-bind") is None
    with pytest.raises(ConfigError):
        c.optional_bind_address("nope", "--metrics-bind")


# -- the supervisor's restart causes (pure) ------------------------------------------------------
def test_restarts_are_counted_by_cause():
    sim = Sim(workers=2, timeout=30.0, max_worker_memory=100, memory_interval=10.0)
    mold, (w0, w1) = sim.up()
    sim.exit(w0)  # died on its own
    assert sim.sup.restarts == {"crash": 1}
    (w0,) = sim.spawn_workers(sim.tick(after=2.0))

    sim.slots[sim.sup.roster.get(w1).slot] = SlotReading(w1, deadline=sim.now + 0.5, requests=1)
    assert Signal(w1, signal.SIGABRT) in sim.tick(after=1.0)  # SIGKILL a second later
    sim.exit(w1, KILLED)
    assert sim.sup.restarts["timeout"] == 1
    (w1,) = sim.spawn_workers(sim.tick())

    sim.handle(messages.WantsRetirement(w0, "served 10 requests (--max-requests)"))
    (new0,) = sim.spawn_workers(sim.tick())
    sim.tick()
    sim.exit(w0, 0)
    assert sim.sup.restarts["max_requests"] == 1

    big = ProcessMemory(w1, rss=200, pss=200, uss=200, private_dirty=200, shared=0, swap=0, minflt=0)
    sim.handle(MemorySampled({w1: big}))
    (new1,) = sim.spawn_workers(sim.tick())
    sim.tick()
    sim.exit(w1, 0)
    assert sim.sup.restarts["memory"] == 1


def test_reload_and_refork_rollouts_count_as_their_own_causes():
    sim = Sim(workers=1)
    mold, (w0,) = sim.up()
    sim.handle(messages.WantsPromotion(w0, 100))  # refork: the worker becomes gen 1's mold
    sim.handle(messages.Spawned("mold", 7777, 1))
    sim.handle(messages.Ready(7777))
    (new,) = sim.spawn_workers(sim.tick())
    sim.tick()
    sim.exit(w0, 0)
    assert sim.sup.restarts == {"refork": 1}

    from refork.process.supervisor.events import ConfigReread, ReloadRequested

    sim.handle(ReloadRequested())
    mold2 = sim.fork_mold(sim.handle(ConfigReread()))
    sim.handle(messages.Ready(mold2))
    (newer,) = sim.spawn_workers(sim.tick())
    sim.tick()
    sim.exit(new, 0)
    assert sim.sup.restarts == {"refork": 1, "reload": 1}


def test_scaling_down_and_stopping_are_no_restarts():
    sim = Sim(workers=2)
    mold, (w0, w1) = sim.up()
    from refork.process.supervisor.events import SetWorkerCount, StopRequested

    sim.handle(SetWorkerCount(1))
    sim.tick()
    sim.exit(w1, 0)
    sim.handle(StopRequested("graceful"))
    sim.exit(w0, 0)
    sim.handle(ChildExited(mold, 0))
    assert sim.sup.restarts == {}
    assert of(sim.tick(), Signal) == []


# -- listen queues from the kernel ---------------------------------------------------------------
def test_listen_queue_of_tcp_and_unix_listeners(tmp_path: Path):
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(7)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "q.sock"))
    unix.listen(5)
    clients = [socket.create_connection(tcp.getsockname()) for _ in range(3)]
    for _ in range(2):
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(tmp_path / "q.sock"))
        clients.append(client)
    try:
        assert listen_queue(tcp) == (3, 7)
        assert listen_queue(unix) == (2, 5)
        tcp.accept()[0].close()
        assert listen_queue(tcp) == (2, 7)
    finally:
        for s in (*clients, tcp, unix):
            s.close()


# -- real servers --------------------------------------------------------------------------------
def send(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


PLAN = ["/"] * 40 + ["/status/201"] * 5 + ["/status/302"] * 6 + ["/status/404"] * 7 + ["/status/503"] * 3


@pytest.mark.parametrize(
    "app,args", [("apps.metrics_apps:app", ["--threads", "4"]), ("apps.metrics_apps:asgi_app", [])]
)
def test_scrape_during_load_then_exact_counts(start_server, app, args):
    mport = free_port()
    server = start_server("--metrics-bind", f"127.0.0.1:{mport}", *args, app=app, workers=2)
    seen: list[dict[str, float]] = []
    done = threading.Event()

    def scraper() -> None:
        while not done.is_set():
            status, headers, text = scrape(mport)
            assert status == 200 and headers["Content-Type"] == CONTENT_TYPE
            seen.append(parse(text))

    watcher = threading.Thread(target=scraper)
    watcher.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda p: send(server.port, p), PLAN))
    finally:
        done.set()
        watcher.join()
    assert sorted(statuses) == sorted(int(p.rsplit("/", 1)[1]) if "status" in p else 200 for p in PLAN)
    assert seen, "no scrape finished during the load"
    previous = 0.0
    for v in seen:  # every scrape during the load is consistent and counters never go down
        requests = v["refork_requests_total"]
        assert requests >= previous
        previous = requests
        inf = v['refork_request_duration_seconds_bucket{le="+Inf"}']
        assert inf == v["refork_request_duration_seconds_count"]

    text, v = settled(mport, len(PLAN))
    promtool_check(text)
    assert v["refork_requests_total"] == len(PLAN)
    assert total(v, "refork_worker_requests_total") == len(PLAN)
    expected = {"1xx": 0, "2xx": 45, "3xx": 6, "4xx": 7, "5xx": 3}
    for cls, n in expected.items():
        assert v[f'refork_responses_total{{code="{cls}"}}'] == n
        assert total(v, "refork_worker_responses_total", code=cls) == n
    assert v['refork_request_duration_seconds_bucket{le="+Inf"}'] == len(PLAN)
    assert v["refork_request_duration_seconds_count"] == len(PLAN)
    assert total(v, "refork_worker_request_duration_seconds_count") == len(PLAN)
    assert total(v, "refork_worker_requests_in_flight") == 0
    assert v['refork_workers{state="ready"}'] == 2 and v["refork_workers_target"] == 2
    assert total(v, "refork_worker_rss_bytes") > 0 and total(v, "refork_worker_uss_bytes") > 0
    assert total(v, "refork_worker_age_seconds") > 0
    listener = f'{{listener="127.0.0.1:{server.port}"}}'
    assert v["refork_listen_queue_length" + listener] == 0
    assert v["refork_listen_queue_limit" + listener] == 2048
    if "--threads" in args:
        assert total(v, "refork_worker_idle_threads") == 8 and total(v, "refork_worker_busy_threads") == 0
    else:
        assert "refork_worker_idle_threads" not in text  # ASGI: no app threads


@pytest.mark.parametrize(
    "app,args", [("apps.metrics_apps:app", ["--threads", "4"]), ("apps.metrics_apps:asgi_app", [])]
)
def test_requests_in_the_app_show_in_flight_and_busy(start_server, app, args):
    mport = free_port()
    server = start_server("--metrics-bind", f"127.0.0.1:{mport}", *args, app=app, workers=1)
    sleeper = threading.Thread(target=send, args=(server.port, "/sleep?1.5"))
    sleeper.start()
    try:
        v = server.wait_for(
            lambda: total(v := parse(scrape(mport)[2]), "refork_worker_requests_in_flight") == 1 and v,
            what="a request in flight",
        )
        if "--threads" in args:
            assert total(v, "refork_worker_busy_threads") == 1 and total(v, "refork_worker_idle_threads") == 3
    finally:
        sleeper.join()
    _, v = settled(mport, 1)
    assert total(v, "refork_worker_requests_in_flight") == 0
    assert v['refork_request_duration_seconds_bucket{le="1.0"}'] == 0  # 1.5 s
    assert v['refork_request_duration_seconds_bucket{le="2.5"}'] == 1
    # (an event loop's timer may fire a little early: uvloop's are whole milliseconds of a loop
    # time read at the start of the iteration)
    assert v["refork_request_duration_seconds_sum"] >= 1.49


def test_stuck_scrapers_do_not_block_a_scrape_or_the_server(start_server):
    mport = free_port()
    server = start_server("--metrics-bind", f"127.0.0.1:{mport}", app="apps.metrics_apps:app", workers=1)
    silent = socket.create_connection(("127.0.0.1", mport))  # connects, never sends
    partial = socket.create_connection(("127.0.0.1", mport))
    partial.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    huge = socket.create_connection(("127.0.0.1", mport))
    try:
        huge.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10_000 + b"\r\n\r\n")
        assert read_all(huge).startswith(b"HTTP/1.1 431 ")  # bounded request size
        assert send(server.port, "/") == 200
        assert settled(mport, 1)[1]["refork_requests_total"] == 1
        assert server.status()["ok"]  # the monitor's loop answers its control socket too
        silent.settimeout(10)
        assert silent.recv(100) == b""  # dropped at the per-connection deadline
    finally:
        for s in (silent, partial, huge):
            s.close()


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_too_many_scrapers_at_once_get_503_and_others_paths_and_methods(start_server):
    mport = free_port()
    args = ("--metrics-bind", f"127.0.0.1:{mport}", "--metrics-buckets", "0.5,2")
    start_server(*args, app="apps.metrics_apps:app", workers=1)
    text = scrape(mport)[2]
    assert 'le="0.5"' in text and 'le="2.0"' in text and 'le="0.005"' not in text  # --metrics-buckets
    promtool_check(text)
    assert scrape(mport, "/")[0] == 404
    assert scrape(mport, "/metricsx")[0] == 404
    assert scrape(mport, "/metrics", "POST")[0] == 405
    assert scrape(mport, "/metrics?name[]=x")[0] == 200
    status, headers, body = scrape(mport, "/metrics", "HEAD")
    assert status == 200 and int(headers["Content-Length"]) > 1000 and body == ""
    idle = [socket.create_connection(("127.0.0.1", mport)) for _ in range(8)]
    try:
        wait_until(lambda: accept_queue(mport) == 0, what="the monitor to accept the 8 scrapers")
        extra = socket.create_connection(("127.0.0.1", mport))
        assert read_all(extra).startswith(b"HTTP/1.1 503 ")
        extra.close()
    finally:
        for s in idle:
            s.close()
    wait_until(lambda: served_connections(mport) == 0, what="the monitor to close the 8 scrapers")
    assert scrape(mport)[0] == 200


def test_a_crashed_worker_is_a_crash_restart_and_totals_never_go_down(start_server, tmp_path):
    path = tmp_path / "metrics.sock"
    server = start_server("--metrics-bind", f"unix:{path}", app="apps.metrics_apps:app", workers=1)
    for _ in range(5):
        assert send(server.port, "/status/404") == 404
    before = server.wait_for(lambda: (v := parse(curl_unix(path)))["refork_requests_total"] == 5 and v)
    assert before['refork_responses_total{code="4xx"}'] == 5
    with pytest.raises((http.client.HTTPException, OSError)):
        send(server.port, "/crash")
    server.wait_ready(1)
    server.wait_for(lambda: [w["requests"] for w in server.workers()] == [0])  # one reading of the table
    assert send(server.port, "/") == 200
    after = server.wait_for(lambda: (v := parse(curl_unix(path)))["refork_requests_total"] == 6 and v)
    assert after['refork_worker_restarts_total{cause="crash"}'] == 1
    assert after["refork_requests_total"] == 6  # the dead worker's 5 are kept
    assert after['refork_responses_total{code="4xx"}'] == 5
    assert total(after, "refork_worker_requests_total") == 1  # the new worker's own series
    assert after['refork_control_commands_total{command="status"}'] >= 1


def curl_unix(path: Path) -> str:
    result = subprocess.run(
        ["curl", "-sS", "--fail", "--unix-socket", str(path), "http://localhost/metrics"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_real_prometheus_scrapes_it(start_server, tmp_path):
    mport = free_port()
    server = start_server("--metrics-bind", f"127.0.0.1:{mport}", app="apps.metrics_apps:app", workers=2)
    for _ in range(7):
        assert send(server.port, "/") == 200
    settled(mport, 7)
    pport = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: refork\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{mport}']\n"
    )
    binary = shutil.which("prometheus")
    assert binary, "prometheus is installed by ./scripts/test (Debian's prometheus package)"
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    prometheus = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{pport}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def query(expr: str) -> list[dict]:
            url = f"http://127.0.0.1:{pport}/api/v1/query?query={expr}"
            with urllib.request.urlopen(url, timeout=5) as resp:
                answer = json.load(resp)
            assert answer["status"] == "success"
            return answer["data"]["result"]

        deadline = time.monotonic() + 60
        result: list[dict] = []
        while time.monotonic() < deadline and prometheus.poll() is None:
            try:
                result = query("refork_requests_total")
            except OSError:
                result = []
            if result and float(result[0]["value"][1]) == 7:
                break
            time.sleep(0.3)
        assert result, (tmp_path / "prometheus.log").read_text(errors="replace")[-3000:]
        assert result[0]["metric"]["job"] == "refork" and float(result[0]["value"][1]) == 7
        up = query("up")
        assert float(up[0]["value"][1]) == 1
        workers = query("refork_worker_requests_total")
        assert {r["metric"]["worker"] for r in workers} == {"0", "1"}
        assert sum(float(r["value"][1]) for r in workers) == 7
        assert not math.isnan(float(query("refork_worker_pss_bytes")[0]["value"][1]))
    finally:
        prometheus.terminate()
        try:
            prometheus.wait(20)
        except subprocess.TimeoutExpired:
            prometheus.kill()
            prometheus.wait()
        log.close()


def test_metrics_bind_taken_is_one_line_exit_2(tmp_path):
    from conftest import run_cli

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        result = run_cli(
            "-b",
            f"127.0.0.1:{free_port()}",
            "--control-socket",
            str(tmp_path / "c.ctl"),
            "--metrics-bind",
            f"127.0.0.1:{port}",
            "--chdir",
            "tests",
            "apps.metrics_apps:app",
        )
    finally:
        taken.close()
    assert result.returncode == 2, result.stderr
    assert "--metrics-bind" in result.stderr and "Traceback" not in result.stderr
