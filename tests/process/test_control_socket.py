"""The control socket cannot be squatted: real processes, and really another local user.

Another user who binds the control socket's path first must not receive root's `refork reload`
nor be believed. The tests that act as another user create a throwaway system user (useradd)
and drop to it in a forked child (setgid/setuid); they need root, which CI has. Without root
they are skipped with that reason: no other uid can be had then. The rest run as anyone.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import ROOT, TESTS, free_port

from refork.errors import ConfigError
from refork.process import control
from refork.status import format_status, printable

ROOTLESS = os.geteuid() != 0
needs_root = pytest.mark.skipif(ROOTLESS, reason="acting as another local user needs root (useradd, setuid)")

FORGED_STATUS = {
    "ok": True,
    "monitor_pid": "1\x1b]0;pwned\x07",
    "generation": 0,
    "workers": 1,
    "allocator": "glibc",
    "total_pss": 0,
    "processes": [
        {
            "pid": 2, "role": "worker", "nr": 0, "generation": 0, "state": "ready\x1b[2J\x1b[31m",
            "requests": 0, "rss": None, "pss": None, "uss": None, "private_dirty": None, "minflt": None,
            "fork_unsafe": "db\x9b6n\x7f\u202e",
        }
    ],
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Set-up: another user, a shared /tmp-like directory, processes run as that user


class User:
    def __init__(self, name: str) -> None:
        import pwd

        entry = pwd.getpwnam(name)
        self.name, self.uid, self.gid = name, entry.pw_uid, entry.pw_gid

    def become(self) -> None:
        """In a forked child: drop every privilege and be this user."""
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)


@pytest.fixture(scope="module")
def squatter() -> Iterator[User]:
    if ROOTLESS:
        pytest.skip("acting as another local user needs root (useradd, setuid)")
    if shutil.which("useradd") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "passwd"], check=True, capture_output=True)
    name = f"rfk-sq-{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        yield User(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def shared_tmp() -> Iterator[str]:
    """A directory like /tmp (world-writable, sticky) that every user can reach."""
    path = tempfile.mkdtemp(prefix="refork-shared-", dir="/tmp")
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_as(user: User, fn: Callable[[], None]) -> None:
    """Run fn in a forked child as `user`; fail the test if it fails."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            user.become()
            fn()
            code = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


STOP = b"STOP: the test is over"


@contextlib.contextmanager
def fake_server(path: str, answer: dict[str, Any], user: User | None = None) -> Iterator[list[bytes]]:
    """A control socket served by someone else (or by us): one answer to every connection.

    Yields a list that, once the block ends, holds what each client sent it: the block's end
    connects once more and sends STOP, and the server answers connections in order, so every
    client before it is recorded by then.
    """
    ready_r, ready_w = os.pipe()
    seen_r, seen_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(ready_r)
            os.close(seen_r)
            if user is not None:
                user.become()
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            os.chmod(path, 0o777)
            listener.listen(8)
            os.write(ready_w, b"R")
            while True:
                client, _ = listener.accept()
                client.settimeout(5)
                try:
                    got = client.recv(65536)
                    if got == STOP:
                        os._exit(0)
                    client.sendall(json.dumps(answer).encode() + b"\n")
                except OSError:
                    got = b""
                client.close()
                os.write(seen_w, json.dumps(got.decode("latin-1")).encode() + b"\n")
        finally:
            os._exit(1)
    os.close(ready_w)
    os.close(seen_w)
    seen: list[bytes] = []
    try:
        assert os.read(ready_r, 1) == b"R", "the fake server did not start"
        yield seen
    finally:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stop:
                stop.settimeout(5)
                stop.connect(path)
                stop.sendall(STOP)
                stop.recv(1)  # (the end: the server exits)
        except OSError:
            pass  # it is gone already
        deadline = time.monotonic() + 10
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        with os.fdopen(seen_r, "rb") as f:
            seen.extend(json.loads(line).encode("latin-1") for line in f.read().splitlines())
        os.close(ready_r)


def refork_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REFORK_")}
    environ.update(env or {})
    environ["PYTHONPATH"] = str(ROOT)
    for key, value in list(environ.items()):
        if value is None:
            del environ[key]
    return subprocess.run(
        [sys.executable, "-m", "refork", *args], cwd=TESTS, env=environ, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def private_env(tmpdir: str) -> dict[str, str]:
    """The environment under which the default path is TMPDIR/refork-UID/NAME.ctl."""
    environ = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    environ["TMPDIR"] = tmpdir
    return environ


def start_refusal(*args: str, env: dict[str, str] | None = None) -> str:
    """Start a server that must refuse at once: its one stderr line."""
    result = refork_cli("-b", f"127.0.0.1:{free_port()}", *args, "apps.procs:app", env=env)
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("refork: error: "), result.stderr
    return lines[0]


# ---------------------------------------------------------------------------------------------
# The default path: private to the user


def test_default_path(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert control.default_path("web") == "/run/user/1000/web.ctl"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches
    assert control.default_path("web") == f"{tmp_path}/refork-{os.geteuid()}/web.ctl"
    assert not (tmp_path / f"refork-{os.geteuid()}").exists()  # the client creates nothing


def test_private_dir_is_created_0700_and_checked(tmp_path):
    private = str(tmp_path / "p")
    control.check_private_dir(private, create=True)
    st = os.lstat(private)
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    os.chmod(private, 0o755)
    with pytest.raises(ConfigError, match="mode 0755"):
        control.check_private_dir(private, create=True)
    control.check_private_dir(private, create=False)  # $XDG_RUNTIME_DIR: not group/world-writable
    os.chmod(private, 0o775)
    with pytest.raises(ConfigError, match="mode 0775"):
        control.check_private_dir(private, create=False)
    os.symlink(private, tmp_path / "link")
    with pytest.raises(ConfigError, match="not a directory"):
        control.check_private_dir(str(tmp_path / "link"), create=True)


def test_server_makes_the_default_dir_and_the_client_finds_it(shared_tmp):
    env = private_env(shared_tmp)
    name = f"t{secrets.token_hex(3)}"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "refork", "-b", f"127.0.0.1:{port}", "-n", name, "-w", "1", "apps.procs:app"],
        cwd=TESTS, env={**env, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        directory = os.path.join(shared_tmp, f"refork-{os.geteuid()}")
        deadline = time.monotonic() + 30
        while True:
            status = refork_cli("status", "-n", name, "--json", env=env)
            if status.returncode == 0:
                break
            assert proc.poll() is None and time.monotonic() < deadline, status.stderr
            time.sleep(0.1)
        assert json.loads(status.stdout)["monitor_pid"] == proc.pid
        st = os.lstat(directory)
        assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
        sock = os.lstat(os.path.join(directory, f"{name}-127.0.0.1:{port}.ctl"))  # one per server
        assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o600
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(20)


def test_two_servers_have_their_own_default_sockets_and_status_says_which(shared_tmp):
    env = {**private_env(shared_tmp), "PYTHONPATH": str(ROOT)}
    name = f"t{secrets.token_hex(3)}"
    ports = [free_port(), free_port()]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "refork", "-b", f"127.0.0.1:{port}", "-n", name, "-w", "1", app],
            cwd=TESTS, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for port, app in zip(ports, ("apps.procs:app", "apps.wsgi_apps:app"), strict=True)
    ]
    try:
        for proc, port, app in zip(procs, ports, ("apps.procs:app", "apps.wsgi_apps:app"), strict=True):
            deadline = time.monotonic() + 30
            while (status := refork_cli("status", "-n", name, "-b", f"127.0.0.1:{port}", env=env)).returncode:
                assert proc.poll() is None and time.monotonic() < deadline, status.stderr
                time.sleep(0.1)
            first = status.stdout.splitlines()[0]
            assert first == f"server {app} on 127.0.0.1:{port} (monitor {proc.pid})"
        both = refork_cli("status", "-n", name, env=env)
        assert both.returncode == 2
        assert both.stderr.count("\n") == 1 and "several refork servers run" in both.stderr
        assert f"127.0.0.1:{ports[0]}" in both.stderr and f"127.0.0.1:{ports[1]}" in both.stderr
        procs[0].send_signal(signal.SIGINT)
        procs[0].wait(20)
        alone = refork_cli("status", "-n", name, env=env)  # the one left is found without -b
        assert alone.returncode == 0 and f"on 127.0.0.1:{ports[1]} (monitor {procs[1].pid})" in alone.stdout
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                proc.wait(20)


def test_refuses_a_loose_xdg_runtime_dir(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o777)
    os.chmod(runtime, 0o777)
    line = start_refusal(env={"XDG_RUNTIME_DIR": str(runtime)})
    assert f"{runtime} has mode 0777" in line


def test_refuses_an_explicit_path_in_a_world_writable_dir_without_sticky_bit(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    line = start_refusal("--control-socket", str(open_dir / "x.ctl"))
    assert "writable by every user and not sticky" in line
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    control.check_location(str(sticky / "x.ctl"), explicit=True)  # like /tmp: fine


def test_refuses_to_unlink_a_file_that_is_not_a_socket(tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    line = start_refusal("--control-socket", str(precious))
    assert "exists and is not a socket" in line
    assert precious.read_text() == "keep me"


def test_off_still_turns_it_off(tmp_path, start_server):
    server = start_server("--control-socket", "off", workers=1, wait=False)
    server.wait_for(lambda: server.get("/")[0] == 200, what="serving")
    assert "control socket" not in server.log()


# ---------------------------------------------------------------------------------------------
# Another user was there first


@needs_root
def test_refuses_a_default_dir_made_by_another_user(squatter, shared_tmp):
    directory = os.path.join(shared_tmp, f"refork-{os.geteuid()}")
    run_as(squatter, lambda: os.mkdir(directory, 0o777))
    line = start_refusal(env=private_env(shared_tmp))
    assert f"{directory} is owned by uid {squatter.uid} ({squatter.name})" in line


@needs_root
def test_refuses_an_xdg_runtime_dir_of_another_user(squatter, shared_tmp):
    runtime = os.path.join(shared_tmp, "run")
    run_as(squatter, lambda: os.mkdir(runtime, 0o700))
    line = start_refusal(env={"XDG_RUNTIME_DIR": runtime})
    assert f"owned by uid {squatter.uid}" in line


@needs_root
def test_refuses_a_socket_another_user_bound_first(squatter, shared_tmp):
    path = os.path.join(shared_tmp, "web.ctl")
    with fake_server(path, {"ok": True, "message": "reloading"}, squatter) as seen:
        line = start_refusal("--control-socket", path)
    assert f"control socket {path} is owned by uid {squatter.uid}" in line
    assert seen == []  # the server did not even probe it


@needs_root
@pytest.mark.parametrize("command", ["reload", "status", "refork", "ttin", "ttou"])
def test_client_does_not_trust_a_socket_of_another_user(squatter, shared_tmp, command):
    path = os.path.join(shared_tmp, "web.ctl")
    forged = {**FORGED_STATUS, "message": "reloading: FORGED"}
    with fake_server(path, forged, squatter) as seen:
        result = refork_cli(command, "--control-socket", path)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert f"{path} is served by uid {squatter.uid} ({squatter.name}), not by root: not trusting it" in line
    assert "FORGED" not in result.stderr and "\x1b" not in result.stderr
    assert seen == [b""]  # it was connected to, and told nothing


@needs_root
def test_server_obeys_nobody_but_its_user_and_root(squatter, shared_tmp, start_server):
    path = os.path.join(shared_tmp, "web.ctl")
    server = start_server("--control-socket", path, workers=1, wait=False)
    server.control = path
    server.wait_ready(1)
    os.chmod(path, 0o666)  # loosened by mistake: the peer check still holds
    answers: list[bytes] = []
    reply_r, reply_w = os.pipe()

    def ask_reload() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(path)
            sock.sendall(b'{"command": "reload"}\n')
            os.write(reply_w, sock.recv(65536))

    run_as(squatter, ask_reload)
    os.close(reply_w)
    with os.fdopen(reply_r, "rb") as f:
        answers.append(f.read())
    assert json.loads(answers[0]) == {
        "ok": False,
        "error": "permission denied: not the server's user or root",
    }
    assert f"refused a client running as uid {squatter.uid} ({squatter.name})" in server.log()
    assert server.status()["generation"] == 0 and "reload" not in server.log()


# ---------------------------------------------------------------------------------------------
# An answer is printed, never obeyed by the terminal


def test_forged_status_from_our_own_uid_is_printed_sanitised(tmp_path):
    path = str(tmp_path / "ours.ctl")
    with fake_server(path, FORGED_STATUS):
        result = refork_cli("status", "--control-socket", path)
    assert result.returncode == 0, result.stderr
    for raw in ("\x1b", "\x07", "\x9b", "\x7f", "\u202e"):
        assert raw not in result.stdout
    assert "1\\x1b]0;pwned\\x07" in result.stdout
    assert "ready\\x1b[2J\\x1b[31m" in result.stdout
    assert "db\\x9b6n\\x7f\\u202e" in result.stdout


def test_forged_messages_are_printed_sanitised(tmp_path):
    path = str(tmp_path / "ours.ctl")
    with fake_server(path, {"ok": False, "error": "reload refused: \x1b[2Jgone"}):
        result = refork_cli("reload", "--control-socket", path)
    assert result.returncode == 1
    assert result.stdout == "reload refused: \\x1b[2Jgone\n"


@pytest.mark.parametrize(
    "answer", [["not", "an", "object"], {"ok": True, "processes": "x"}, {"ok": True, "monitor_pid": 1}]
)
def test_a_malformed_answer_is_one_line(tmp_path, answer):
    path = str(tmp_path / "ours.ctl")
    with fake_server(path, answer):
        result = refork_cli("status", "--control-socket", path)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


def test_printable_escapes_controls_only():
    assert printable("a\x00b\x1b[1m\x7f\x85\u202e\u2066é✓ tab\there") == (
        "a\\x00b\\x1b[1m\\x7f\\x85\\u202e\\u2066é✓ tab\\x09here"
    )
    assert "\\x1b" in format_status(FORGED_STATUS)
