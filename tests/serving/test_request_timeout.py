"""--request-timeout (soft: the stack, a graceful replacement) and refork.extend_deadline(), with
real processes; --timeout stays the hard kill. The AppClock logic itself: tests/serving/test_app_clock.py."""

from __future__ import annotations

import http.client
import signal
import threading
import time

import pytest
from support.supervisor_sim import Sim, of, sends

from refork.process import messages
from refork.process.supervisor.core import NUDGE_GRACE
from refork.process.supervisor.events import Signal, SlotReading

WSGI = "apps.request_timeouts:app"
ASGI = "apps.request_timeouts:asgi"


def fetch(port: int, path: str, timeout: float = 30.0) -> tuple[int, int]:
    """(status, serving pid) over a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, int(resp.read().split()[0])
    finally:
        conn.close()


def send_and_forget(port: int, path: str) -> threading.Thread:
    """A request whose answer never comes (the worker hangs, then is killed): no error wanted."""

    def run() -> None:
        try:
            fetch(port, path, timeout=60)
        except (OSError, http.client.HTTPException, ValueError):
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_hung_request_is_logged_with_its_stack_and_its_worker_replaced_without_losing_a_request(
    start_server,
) -> None:
    """The issue's test: --threads 8 --request-timeout 2, one hanging request and seven slow ones."""
    server = start_server("--threads", "8", "--request-timeout", "2", "--graceful-timeout", "4",
                          app=WSGI, workers=1)  # fmt: skip
    [old] = server.workers()
    send_and_forget(server.port, "/hang")
    results: list[tuple[int, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    replaced = threading.Event()

    def client() -> None:  # one of seven: slow requests, one after another, until a new pid answers
        try:
            while not replaced.is_set():
                status, pid = fetch(server.port, "/slow?1.5")
                with lock:
                    results.append((status, pid))
                if pid != old["pid"]:
                    replaced.set()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            replaced.set()

    clients = [threading.Thread(target=client) for _ in range(7)]
    for t in clients:
        t.start()
    hung = server.wait_for(lambda: [w for w in server.workers(None) if w["overdue"]], what="hung in status")
    assert [w["pid"] for w in hung] == [old["pid"]] and hung[0]["overdue"] == 1
    for t in clients:
        t.join(60)
    assert not errors, errors
    log = server.log()
    assert "request timeout: GET /hang in the app for" in log
    assert "hang_forever" in log  # the function the hung thread is stuck in
    assert log.count("request timeout: GET /hang in the app for") == 1  # once, not every tick
    assert "request timeout: GET /slow" not in log  # the slow ones are not overdue
    assert results and all(status == 200 for status, _ in results)
    assert {pid for _, pid in results} - {old["pid"]}  # the replacement serves
    assert sum(pid == old["pid"] for _, pid in results) >= 7  # the old worker finished its seven
    new = server.wait_for(lambda: [w for w in server.workers() if w["pid"] != old["pid"]], what="replacement")
    assert new[0]["nr"] == old["nr"]
    # the old worker goes once its other requests are done and --graceful-timeout ran out for /hang
    server.wait_for(lambda: old["pid"] not in {w["pid"] for w in server.workers(None)}, 30, "old worker gone")
    assert fetch(server.port, "/")[1] == new[0]["pid"]


@pytest.mark.parametrize("threads", ["1", "2"])  # 1: the native engine (registers on demand)
def test_extend_deadline_lets_a_long_request_pass_the_soft_timeout(start_server, threads: str) -> None:
    server = start_server("--threads", threads, "--request-timeout", "1", app=WSGI, workers=1)
    [worker] = server.workers()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/extend?2.5")
    resp = conn.getresponse()
    assert (resp.status, resp.read().endswith(b"extended=True")) == (200, True)
    conn.close()
    assert fetch(server.port, "/")[1] == worker["pid"]  # not retired
    time.sleep(1.2)  # (the input, not a wait) a tick or two later, still nothing to report
    assert "request timeout" not in server.log()
    assert [w["pid"] for w in server.workers()] == [worker["pid"]]


def test_extend_deadline_answers_true_inside_a_request_asgi_too(start_server) -> None:
    server = start_server("--request-timeout", "1", app=ASGI, workers=1)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/extend?2.5")  # past 1 s and at least one tick after it
    body = conn.getresponse().read()
    conn.close()
    assert body.endswith(b"extended=True")
    assert "request timeout" not in server.log()


def test_asgi_an_awaiting_hung_request_shows_its_awaits_and_the_worker_is_replaced(start_server) -> None:
    server = start_server("--request-timeout", "1", "--graceful-timeout", "3", app=ASGI, workers=1)
    [old] = server.workers()
    send_and_forget(server.port, "/hang")
    server.wait_for(lambda: "request timeout: GET /hang" in server.log(), what="the timeout logged")
    assert "hang_forever_async" in server.log()
    new = server.wait_for(lambda: [w for w in server.workers() if w["pid"] != old["pid"]], what="replacement")
    assert fetch(server.port, "/")[0] == 200
    server.wait_for(lambda: fetch(server.port, "/")[1] == new[0]["pid"], what="the replacement serving")


@pytest.mark.parametrize("app", [WSGI, ASGI], ids=["wsgi-threads-1", "asgi-no-await"])
def test_a_loop_blocked_in_the_app_is_found_by_the_monitor_and_its_stack_logged(start_server, app) -> None:
    server = start_server("--request-timeout", "1", "--graceful-timeout", "2", app=app, workers=1)
    [old] = server.workers()
    send_and_forget(server.port, "/block")
    server.wait_for(lambda: "request timeout: GET /block" in server.log(), what="the timeout logged")
    log = server.log()
    assert "block_the_loop" in log and "blocked in the app" in log, log
    server.wait_for(lambda: fetch(server.port, "/")[1] != old["pid"], what="a new pid serving")


def test_timeout_still_kills_a_worker_whose_request_ignores_everything(start_server) -> None:
    server = start_server("--request-timeout", "1", "--timeout", "3", "--graceful-timeout", "30",
                          app=WSGI, workers=1)  # fmt: skip
    [old] = server.workers()
    send_and_forget(server.port, "/deaf")  # SIGUSR2 blocked: no stack can be taken
    server.wait_for(lambda: "busy longer than 3s; aborting it" in server.log(), what="the hard kill")
    server.wait_for(lambda: fetch(server.port, "/")[1] != old["pid"], what="the replacement serving")
    assert "request timeout: GET /deaf" not in server.log()


# -- the supervisor's part, without processes (tests/support/supervisor_sim.py) --------------


def test_a_request_timeout_retirement_carries_its_cause_and_gets_a_replacement_before_its_stop() -> None:
    sim = Sim(workers=1, request_timeout=2.0)
    _mold, [old] = sim.up()
    sim.handle(messages.WantsRetirement(old, "request timeout: GET /x", cause="request_timeout"), after=5.0)
    worker = sim.sup.roster.get(old)
    assert worker is not None and worker.restart_cause == "request_timeout"
    actions = sim.tick(0.1)
    assert sends(actions, messages.SpawnWorker) and not sends(actions, messages.Stop)
    [new] = sim.spawn_workers(actions)
    assert sends(sim.tick(0.1), messages.Stop, old)  # its replacement is ready: now it may go
    assert sim.worker(0) == new


def test_the_monitor_nudges_a_blocked_worker_once_per_overdue_request() -> None:
    sim = Sim(workers=1, request_timeout=2.0, timeout=30.0)
    _mold, [pid] = sim.up()
    slot = sim.sup.roster.get(pid).slot
    entered = sim.now + 1.0  # the request that blocks the loop entered the app then
    sim.slots[slot] = SlotReading(pid, entered + 30.0, 1)
    assert not of(sim.tick(1.0 + 2.0 + NUDGE_GRACE - 0.1), Signal)
    assert of(sim.tick(0.2), Signal) == [Signal(pid, signal.SIGUSR2)]
    assert not of(sim.tick(5.0), Signal)  # the same request: once
    sim.handle(messages.WantsRetirement(pid, "request timeout", cause="request_timeout"))
    sim.slots[slot] = SlotReading(pid, sim.now + 30.0 - 10.0, 1)  # another one, overdue too
    assert not [a for a in sim.tick(1.0) if isinstance(a, Signal) and a.signum == signal.SIGUSR2]


def test_no_nudge_without_request_timeout() -> None:
    sim = Sim(workers=1, timeout=30.0)
    _mold, [pid] = sim.up()
    slot = sim.sup.roster.get(pid).slot
    sim.slots[slot] = SlotReading(pid, sim.now + 29.0, 1)  # in the app for a second
    assert not of(sim.tick(20.0), Signal)


def test_refork_status_shows_hung_requests_in_the_note() -> None:
    from refork.status import format_status

    row = {"pid": 2, "role": "worker", "nr": 0, "generation": 0, "state": "stopping", "requests": 5,
           "rss": None, "pss": None, "uss": None, "private_dirty": None, "minflt": None,
           "fork_unsafe": None, "retiring": "request timeout: GET /x", "overdue": 1}  # fmt: skip
    status = {"monitor_pid": 1, "generation": 0, "workers": 1, "allocator": "glibc", "total_pss": 0,
              "processes": [row]}  # fmt: skip
    assert "1 hung (past --request-timeout); request timeout: GET /x" in format_status(status)
