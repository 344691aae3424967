"""Logs that cannot be written never take the server down, on every request path.

A full disk is /dev/full (every write fails with ENOSPC), reached through a symlink that the test
then replaces with a real file; a deleted log directory is an rmtree under the live server. Then
USR1: the monitor and the workers live on (same pids), every request is answered, the server's
stderr holds a few lines (the lost lines counted, the failed reopen said once), not a traceback per
line, and once the file can be written again (the directory back, another USR1) the lines resume.
The lost lines are counted in the metric refork_log_write_errors_total, by log.
"""

from __future__ import annotations

import http.client
import os
import re
import shutil
import signal
from contextlib import closing

from conftest import free_port, read_to_end
from support.h2client import H2Client
from support.request_paths import connect, every_path, flags, http2, tls

REQUESTS = 30  # lines lost to a full disk: a traceback each would be hundreds of stderr lines


def _get(path: str, port: int, count: int = 1) -> list[int]:
    """The statuses of `count` GETs as the path's clients send them (HTTP/1.1: a connection each)."""
    if http2(path):
        with closing(H2Client(port, timeout=10, tls=tls(path))) as client:
            return [client.request("GET", "/")[0] for _ in range(count)]
    statuses = []
    for _ in range(count):
        with connect(path, port) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            statuses.append(int(read_to_end(sock).split()[1]))
    return statuses


def _warnings(server) -> list[str]:
    """The server's output but its INFO lines (start-up, workers ready)."""
    return [line for line in server.log().splitlines() if "[INFO]" not in line]


def _lost(metrics_port: int) -> dict[str, int]:
    """refork_log_write_errors_total by log, scraped."""
    conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {log: int(n) for log, n in re.findall(r'refork_log_write_errors_total\{log="(\w+)"\} (\d+)', text)}


def _has_lines(log) -> bool:
    return log.exists() and log.stat().st_size > 0


def _wait_for_lines(server, path: str, access) -> None:
    """Requests until their lines reach `access` (each worker has had the USR1 by then)."""
    server.wait_for(lambda: _get(path, server.port) == [200] and _has_lines(access), what="access lines")


@every_path
def test_full_disk_then_usr1(path, start_server, tmp_path):
    args, app = flags(path, "apps.access_apps")
    access, error = tmp_path / "access.log", tmp_path / "error.log"
    access.symlink_to("/dev/full")
    error.symlink_to("/dev/full")
    metrics = free_port()
    server = start_server(*args, "--access-logfile", str(access), "--error-logfile", str(error),
                          "--metrics-bind", f"127.0.0.1:{metrics}", app=app, workers=1)  # fmt: skip
    workers = [w["pid"] for w in server.workers()]
    assert _get(path, server.port, REQUESTS) == [200] * REQUESTS
    server.wait_for(lambda: "line(s) lost (ENOSPC" in server.log(), what="the lost lines told")
    lost = server.wait_for(lambda: (n := _lost(metrics))["access"] == REQUESTS and n, what="the count")
    assert lost["error"] >= 1  # the worker's own report of its access lines, to a full error log

    access.unlink()  # the disk has room again: the next reopen opens real files
    error.unlink()
    server.signal(signal.SIGUSR1)
    _wait_for_lines(server, path, access)
    assert server.proc.poll() is None and [w["pid"] for w in server.workers()] == workers
    assert error.exists()  # reopened by the monitor too (before it told the workers)
    assert _get(path, server.port, 3) == [200] * 3
    output = _warnings(server)
    assert len(output) < 20 and "Traceback" not in server.log(), server.log()


@every_path
def test_deleted_log_directory_then_usr1(path, start_server, tmp_path):
    args, app = flags(path, "apps.access_apps")
    logs = tmp_path / "logs"
    logs.mkdir()
    access = logs / "access.log"
    metrics = free_port()
    server = start_server(*args, "--access-logfile", str(access), "--metrics-bind", f"127.0.0.1:{metrics}",
                          app=app, workers=1)  # fmt: skip
    workers = [w["pid"] for w in server.workers()]
    assert _get(path, server.port) == [200]
    server.wait_for(lambda: _has_lines(access), what="the first access line")

    shutil.rmtree(logs)
    server.signal(signal.SIGUSR1)
    server.wait_for(lambda: "cannot reopen (ENOENT" in server.log(), what="the failed reopen told")
    assert _get(path, server.port, 5) == [200] * 5
    assert server.proc.poll() is None and [w["pid"] for w in server.workers()] == workers

    os.kill(workers[0], signal.SIGKILL)  # a worker started while the directory is gone serves too
    server.wait_for(lambda: [w["pid"] for w in server.workers()] not in ([], workers), what="a new worker")
    assert _get(path, server.port, 3) == [200] * 3
    assert "cannot open (ENOENT" in server.log()
    server.wait_for(lambda: _lost(metrics)["access"] == 3, what="the new worker's lines counted")

    logs.mkdir()
    server.signal(signal.SIGUSR1)
    _wait_for_lines(server, path, access)
    output = _warnings(server)
    assert len(output) < 20 and "Traceback" not in server.log(), server.log()
