"""The process model, end to end: real processes, real signals, real HTTP."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import time

import pytest
from conftest import free_port, pids_alive, run_cli
from support.waits import wait_until


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode().strip()


def test_serves_and_every_process_is_a_direct_child_of_the_monitor(start_server):
    server = start_server(workers=2)
    status = server.status()
    monitor = status["monitor_pid"]
    assert monitor == server.proc.pid
    pids = {p["pid"] for p in status["processes"]}
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            assert int(f.read().split(")")[1].split()[1]) == monitor
    code, body = server.get("/")
    assert code == 200
    pid, ppid = map(int, body.split())
    assert ppid == monitor
    assert cmdline(monitor) == "refork: monitor"
    assert cmdline(server.mold()["pid"]) == "refork: mold (gen 0)"
    titles = sorted(cmdline(w["pid"]) for w in server.workers())
    assert titles == ["refork: worker 0 (gen 0)", "refork: worker 1 (gen 0)"]


def test_term_is_a_graceful_stop_that_finishes_in_flight_requests(start_server):
    import threading

    server = start_server(workers=1)
    result = {}

    def slow():
        result["response"] = server.get("/sleep?1.5")

    thread = threading.Thread(target=slow)
    thread.start()
    server.wait_for(lambda: server.workers()[0]["busy"] == 1, what="the request in the app")
    children = [p["pid"] for p in server.status()["processes"]]
    server.signal(signal.SIGTERM)
    thread.join(10)
    assert result["response"] == (200, b"slept")
    assert server.wait_exit(20) == 0
    assert pids_alive(children) == []


def test_int_is_a_fast_stop(start_server):
    server = start_server(workers=2)
    children = [p["pid"] for p in server.status()["processes"]]
    server.signal(signal.SIGINT)
    assert server.wait_exit(10) == 0
    wait_until(lambda: pids_alive(children) == [], what="every child gone")


def test_ttin_and_ttou_change_the_worker_count(start_server):
    server = start_server(workers=1)
    server.signal(signal.SIGTTIN)
    server.wait_for(lambda: len(server.workers()) == 2, what="2 workers after TTIN")
    server.signal(signal.SIGTTIN)
    server.wait_for(lambda: len(server.workers()) == 3, what="3 workers after TTIN")
    server.signal(signal.SIGTTOU)
    server.wait_for(lambda: len(server.workers(state=None)) == 2, what="2 workers after TTOU")


def test_monitor_death_stops_every_child(start_server):
    server = start_server(workers=2)
    children = [p["pid"] for p in server.status()["processes"]]
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    deadline = time.monotonic() + 10
    while pids_alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids_alive(children) == []


def test_unix_socket_bind(start_server, tmp_path):
    import http.client
    import socket

    path = tmp_path / "refork.sock"
    server = start_server("-b", f"unix:{path}", workers=1)

    class UnixConnection(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(str(path))

    conn = UnixConnection("localhost")
    conn.request("GET", "/")
    assert conn.getresponse().status == 200
    conn.close()
    server.signal(signal.SIGTERM)
    server.wait_exit(20)
    assert not path.exists()


def test_bad_app_path_is_one_line_and_exit_2():
    result = run_cli("-b", "127.0.0.1:0", "--chdir", "tests", "nosuchmodule:app")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(lines) == 1 and "nosuchmodule" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_unbindable_address_is_one_line_and_exit_2(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ctl = str(tmp_path / "ctl")  # not the default one: another refork on this machine may hold it
        result = run_cli(
            "-b", f"127.0.0.1:{port}", "--control-socket", ctl, "--chdir", "tests", "apps.procs:app"
        )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "cannot bind" in result.stderr and "Traceback" not in result.stderr


def test_usr1_reopens_log_files(start_server, tmp_path):
    access = tmp_path / "access.log"
    server = start_server("--access-logfile", str(access), workers=1)
    assert server.get("/")[0] == 200
    server.wait_for(lambda: access.exists() and access.stat().st_size > 0, what="access log line")
    access.rename(tmp_path / "access.log.1")
    server.signal(signal.SIGUSR1)
    server.wait_for(  # (requests before the reopen go to the renamed file)
        lambda: server.get("/")[0] == 200 and access.exists() and access.stat().st_size > 0,
        timeout=10,
        what="a new access log file",
    )


def test_asgi_app_through_the_cli(start_server):
    server = start_server(app="apps.procs:asgi_app", workers=2)
    code, body = server.get("/")
    assert code == 200 and int(body) in {w["pid"] for w in server.workers()}


def test_without_subreaper_workers_are_children_of_the_mold(start_server):
    server = start_server(workers=2, env={"REFORK_NO_SUBREAPER": "1"})
    mold = server.mold()["pid"]
    _, body = server.get("/")
    assert int(body.split()[1]) == mold
    assert "subreaper unavailable" in server.log()
    victim = server.workers()[0]
    os.kill(victim["pid"], signal.SIGKILL)
    server.wait_for(
        lambda: victim["pid"] not in {w["pid"] for w in server.workers()} and len(server.workers()) == 2,
        what="replacement without subreaper",
    )
    workers = [w["pid"] for w in server.workers()]
    server.signal(signal.SIGINT)  # the mold reports its workers' exits before its own
    assert server.wait_exit(30) == 0
    assert "did not stop in time" not in server.log()
    assert pids_alive(workers) == []


@pytest.mark.parametrize(("bind", "clients"), [
    ("[::1]", ("::1",)),
    ("[::]", ("127.0.0.1", "::1")),  # dual-stack, as gunicorn's (its users' container habit)
])  # fmt: skip
def test_ipv6_binds(start_server, bind, clients):
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback")
    port = free_port()
    start_server("-b", f"{bind}:{port}", workers=1)
    for host in clients:
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/")
        assert conn.getresponse().status == 200, host
        conn.close()


def test_fd_bind_serves_an_inherited_socket(tmp_path):
    import http.client
    import socket
    import subprocess
    import sys

    from conftest import ROOT, TESTS

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    ctl = str(tmp_path / "fd.ctl")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "refork",
            "-b",
            f"fd://{fd}",
            "--control-socket",
            ctl,
            "--chdir",
            str(TESTS),
            "apps.procs:app",
        ],
        cwd=ROOT,
        pass_fds=[fd],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    listener.close()
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/")
                assert conn.getresponse().status == 200
                conn.close()
                break
            except (OSError, http.client.HTTPException):
                assert time.monotonic() < deadline, "fd:// listener never answered"
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_hup_with_a_broken_app_keeps_the_current_generation_serving(start_server, tmp_path):
    flag = tmp_path / "broken"
    server = start_server(app="apps.reloadable:app", workers=2, env={"REFORK_TEST_BREAK": str(flag)})
    workers = {w["pid"] for w in server.workers()}
    flag.write_text("1")
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: "failed to load the app" in server.log(), what="the failed reload logged")
    assert server.status()["generation"] == 0
    assert {w["pid"] for w in server.workers()} == workers
    assert server.get("/")[0] == 200
    flag.unlink()
    server.signal(signal.SIGHUP)
    server.wait_for(
        lambda: (
            server.status()["generation"] == 1
            and len(server.workers()) == 2
            and not workers & {w["pid"] for w in server.workers()}
        ),
        what="a good reload",
    )
