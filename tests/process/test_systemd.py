"""systemd: socket activation (Debian's systemd-socket-activate) and Type=notify (a real
NOTIFY_SOCKET datagram socket read by the test), plus the pure parsing in refork.process.systemd."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

from conftest import ROOT, TESTS, free_port

from refork.process import systemd


# -- pure ----------------------------------------------------------------------------------------
def test_listen_fds_are_ours_only_when_listen_pid_matches():
    env = {"LISTEN_FDS": "2", "LISTEN_PID": "42", "LISTEN_FDNAMES": "web:admin"}
    assert systemd.listen_fds(env, 42) == [(3, "web"), (4, "admin")]
    assert systemd.listen_fds(env, 43) == []
    assert systemd.listen_fds({"LISTEN_FDS": "1", "LISTEN_PID": "7"}, 7) == [(3, "unknown")]
    assert systemd.listen_fds({"LISTEN_FDS": "x", "LISTEN_PID": "7"}, 7) == []
    taken = dict(env)
    assert systemd.take_listen_fds(taken, 42) == [(3, "web"), (4, "admin")] and taken == {}


def test_notify_address_and_watchdog():
    assert systemd.notify_address("@sd") == b"\0sd"
    assert systemd.notify_address("/run/systemd/notify") == "/run/systemd/notify"
    assert systemd.notify_address("") is None and systemd.notify_address("vsock:2:3") is None
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "4000000"}, 9) == 2.0
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "9"}, 9) == 2.0
    assert systemd.watchdog_interval({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "8"}, 9) is None
    assert systemd.watchdog_interval({}, 9) is None
    assert systemd.milestone_message("reloading", 123) == "RELOADING=1\nMONOTONIC_USEC=123"
    assert systemd.milestone_message("reloaded", 0) == systemd.milestone_message("ready", 0) == "READY=1"
    assert systemd.milestone_message("stopping", 0) == "STOPPING=1"
    assert systemd.status_text(2, 3, 4) == "gen 2, 3/4 workers ready"


# -- socket activation ---------------------------------------------------------------------------
def activate(tmp_path, *extra: str) -> tuple[subprocess.Popen, int, object]:
    port = free_port()
    log = open(tmp_path / "activate.log", "wb")  # noqa: SIM115 - closed by the caller
    cmd = ["systemd-socket-activate", "-l", f"127.0.0.1:{port}", *extra, sys.executable, "-m", "refork",
           "--control-socket", str(tmp_path / "ctl"), "--chdir", str(TESTS), "-w", "2",
           "-b", "127.0.0.1:1",  # never bound: the activated socket is used instead
           "apps.lifecycle_apps:wsgi"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    return proc, port, log


def get(port: int, path: str, timeout: float = 20.0) -> tuple[int, bytes]:
    deadline = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except ConnectionRefusedError:  # systemd-socket-activate is not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            conn.close()


def test_socket_activation_serves_on_the_passed_socket(tmp_path):
    proc, port, log = activate(tmp_path, "--fdname=web")
    try:
        # the first connection makes systemd-socket-activate exec refork; it waits in the backlog
        try:
            status, body = get(port, "/first")
        except OSError as e:
            raise AssertionError(f"{e!r}:\n{(tmp_path / 'activate.log').read_text()}") from e
        assert status == 200 and body.startswith(b"/first "), (tmp_path / "activate.log").read_text()
        assert get(port, "/env") == (200, b"")  # LISTEN_* / NOTIFY_* are not passed on to the app
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        text = (tmp_path / "activate.log").read_text()
        assert "socket activation: 1 socket(s) from systemd; --bind is not used" in text
        assert f"listening on 127.0.0.1:{port}" in text and "127.0.0.1:1\n" not in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


# -- notify --------------------------------------------------------------------------------------
class NotifySocket:
    """What systemd would read: every datagram, in order."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + address[1:].encode() if address.startswith("@") else address)
        self.sock.settimeout(20)
        self.messages: list[str] = []

    def until(self, line: str) -> list[str]:
        """Read datagrams up to one holding `line`; return all read so far."""
        while not any(line in m.splitlines() for m in self.messages):
            self.messages.append(self.sock.recv(4096).decode())
        return self.messages

    def lines(self) -> list[str]:
        return [line for m in self.messages for line in m.splitlines()]


def test_notify_ready_reloading_stopping_and_watchdog(start_server, tmp_path):
    path = str(tmp_path / "notify")
    notify = NotifySocket(path)
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "600000"}
    server = start_server(app="apps.lifecycle_apps:wsgi", workers=2, env=env)
    notify.until("READY=1")
    ready = [m for m in notify.messages if "READY=1" in m.splitlines()][0]
    assert "STATUS=gen 0, 2/2 workers ready" in ready.splitlines()
    notify.until("WATCHDOG=1")
    assert server.get("/env") == (200, b"")
    server.signal(signal.SIGHUP)
    notify.until("RELOADING=1")
    reloading = [m for m in notify.messages if "RELOADING=1" in m.splitlines()][0]
    usec = int(reloading.split("MONOTONIC_USEC=")[1].split()[0])
    assert abs(usec / 1e6 - time.clock_gettime(time.CLOCK_MONOTONIC)) < 60
    count = len(notify.messages)
    while not any("READY=1" in m.splitlines() for m in notify.messages[count:]):
        notify.messages.append(notify.sock.recv(4096).decode())
    server.signal(signal.SIGTERM)
    notify.until("STOPPING=1")
    assert server.wait_exit() == 0
    kinds = [line for line in notify.lines() if line.split("=")[0] in ("READY", "RELOADING", "STOPPING")]
    assert kinds == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
    assert any(line.startswith("STATUS=gen 1, ") for line in notify.lines())


def test_notify_on_an_abstract_socket_without_watchdog(start_server):
    address = f"@refork-test-{uuid.uuid4().hex}"
    notify = NotifySocket(address)
    server = start_server(app="apps.lifecycle_apps:asgi", workers=1, env={"NOTIFY_SOCKET": address})
    notify.until("READY=1")
    server.signal(signal.SIGTERM)
    notify.until("STOPPING=1")
    assert server.wait_exit() == 0
    assert "WATCHDOG=1" not in notify.lines()
