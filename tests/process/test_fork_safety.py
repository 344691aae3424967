"""Fork safety as a checked property: connections and threads alive at fork, with real sockets."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest
from conftest import ROOT, TESTS, free_port, run_cli
from support.load import Load


@pytest.fixture
def peer():
    """A real TCP server the app connects to, standing in for a database."""
    with socket.create_server(("127.0.0.1", 0), backlog=64) as server:
        yield server.getsockname()[1]


def generations(server) -> set[int]:
    return {w["generation"] for w in server.workers(state=None)}


def leaky_env(peer: int, **extra: str) -> dict[str, str]:
    return {"REFORK_TEST_PEER": str(peer), **extra}


def test_the_mold_names_each_load_time_connection_and_thread_and_where_it_was_made(start_server, peer):
    env = leaky_env(peer, REFORK_TEST_CONNECT_AT_IMPORT="1", REFORK_TEST_THREAD="1")
    server = start_server(app="apps.leaky:app", workers=1, env=env)
    assert server.get("/")[0] == 200  # warn (the default) logs and serves
    log = server.log()
    leaky = TESTS / "apps" / "leaky.py"
    assert re.search(
        rf"fork safety: the mold \(gen 0\) holds a connection to 127\.0\.0\.1:{peer} \(fd \d+\), "
        rf"made at {re.escape(str(leaky))}:\d+ in _connect <- {re.escape(str(leaky))}:\d+ in <module>",
        log,
    )
    assert re.search(
        rf"fork safety: the mold \(gen 0\) holds a thread 'leaky-poller' \(daemon\), "
        rf"made at {re.escape(str(leaky))}:\d+ in <module>",
        log,
    )
    assert "fork safety: every worker forked from the mold (gen 0) inherits these; close connections" in log


def test_strict_refuses_to_start_with_one_line(peer):
    result = subprocess.run(
        [sys.executable, "-m", "refork", "-b", f"127.0.0.1:{free_port()}", "--control-socket", "off",
         "--chdir", str(TESTS), "--fork-safety", "strict", "apps.leaky:app"],
        capture_output=True, text=True, timeout=30, cwd=ROOT,
        env={**os.environ, **leaky_env(peer, REFORK_TEST_CONNECT_AT_IMPORT="1")},
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("refork: error:")]
    assert len(errors) == 1
    last = errors[0]
    assert last.startswith(
        f"refork: error: fork safety: the mold (gen 0) holds 1 connection(s) or thread(s) a fork must "
        f"not copy, first a connection to 127.0.0.1:{peer}"
    )
    assert last.endswith("(--fork-safety strict)")
    assert "Traceback" not in result.stderr


def test_a_clean_app_passes_strict(start_server):
    server = start_server("--fork-safety", "strict", workers=1)
    assert server.get("/")[0] == 200
    assert "fork safety" not in server.log()


def test_check_config_is_the_ci_guard(peer, monkeypatch):
    monkeypatch.setenv("REFORK_TEST_PEER", str(peer))
    monkeypatch.setenv("REFORK_TEST_CONNECT_AT_IMPORT", "1")
    guard = run_cli("--check-config", "--fork-safety", "strict", "--chdir", "tests", "apps.leaky:app")
    assert guard.returncode == 2
    error = guard.stderr.strip().splitlines()[-1]
    assert error.startswith("refork: error: fork safety: the loaded app holds 1 connection(s)")
    warned = run_cli("--check-config", "--chdir", "tests", "apps.leaky:app")
    assert warned.returncode == 0
    assert warned.stdout.strip() == "config ok: apps.leaky:app (wsgi); fork safety: 1 warning(s) above"
    clean = run_cli("--check-config", "--fork-safety", "strict", "--chdir", "tests", "apps.procs:app")
    assert clean.returncode == 0 and clean.stdout.strip() == "config ok: apps.procs:app (wsgi)"


def test_a_promoted_mold_cuts_a_connection_its_worker_opened(start_server, peer):
    server = start_server(app="apps.leaky:app", workers=1, env=leaky_env(peer))
    assert server.get("/connect")[1].split()[1] == b"1"
    assert server.request("refork")["ok"] is True
    server.wait_for(lambda: generations(server) == {1}, what="gen 1")
    log = server.log()
    assert f"fork safety: the promoted mold holds a connection to 127.0.0.1:{peer}" in log
    assert "fork safety: it cut its copies (the worker it came from keeps its own)" in log


def test_strict_refuses_the_promotion_and_the_worker_is_not_asked_again(start_server, peer):
    server = start_server("--fork-safety", "strict", app="apps.leaky:app", workers=1, env=leaky_env(peer))
    server.get("/connect")
    assert server.request("refork")["ok"] is True
    server.wait_for(lambda: "will not be promoted again" in server.log(), what="the refused promotion")
    worker = server.workers()[0]
    assert worker["generation"] == 0
    assert worker["fork_unsafe"] == "its promoted mold refused to start (see the log)"
    assert server.request("refork")["ok"] is False  # no promotable worker left
    assert server.get("/")[0] == 200


@pytest.mark.parametrize(
    ("app", "flags"),
    [("apps.procs:asgi_app", ()), ("apps.procs:app", ("--threads", "4"))],
    ids=["asgi", "threads"],
)
def test_a_worker_promoted_under_load_holds_no_connection_but_its_clients(start_server, app, flags):
    server = start_server("--fork-safety", "strict", *flags, app=app, workers=2)
    with Load(server.port, threads=6, keep_alive=False) as load:  # many connections in every state
        load.wait_for_requests(50)
        assert server.request("refork")["ok"] is True
        server.wait_for(
            lambda: generations(server) == {1} and len(server.workers()) == 2,
            timeout=30,
            what="gen 1 everywhere",
        )
    assert load.failures == [], server.log()
    assert "fork safety" not in server.log()


def test_a_pre_promotion_hook_closes_connections_before_the_fork(start_server, peer, tmp_path):
    conf = tmp_path / "refork.conf.py"
    conf.write_text("def pre_promotion(server, worker):\n    import apps.leaky\n    apps.leaky.close_all()\n")
    server = start_server("-c", str(conf), "--fork-safety", "strict", app="apps.leaky:app", workers=1,
                          env=leaky_env(peer))
    server.get("/connect")
    assert server.request("refork")["ok"] is True
    server.wait_for(lambda: generations(server) == {1}, what="gen 1")
    assert "fork safety" not in server.log()


def test_open_connections_finds_tcp_and_named_unix_streams_only(peer, tmp_path):
    from refork.process.fork_check import cut, open_connections

    path = str(tmp_path / "db.sock")
    unix_server = socket.socket(socket.AF_UNIX)
    unix_server.bind(path)
    unix_server.listen()
    pair = socket.socketpair()
    tcp = socket.create_connection(("127.0.0.1", peer))
    unix = socket.socket(socket.AF_UNIX)
    unix.connect(path)
    mine = {tcp.fileno(), unix.fileno()}
    try:
        candidates = mine | {s.fileno() for s in (unix_server, *pair)}
        found = {h.fd: h for h in open_connections() if h.fd in candidates}
        assert found.keys() == mine  # not the listener, not the unnamed socketpair
        assert found[tcp.fileno()].what == f"a connection to 127.0.0.1:{peer} (fd {tcp.fileno()})"
        assert found[unix.fileno()].what == f"a connection to {path} (fd {unix.fileno()})"
        cut(list(found.values()))
        with pytest.raises(OSError):
            tcp.send(b"x")  # this process's copy is dead
        assert not [h for h in open_connections() if h.fd in mine]
    finally:
        for sock in (unix_server, *pair, tcp, unix):
            sock.close()


def test_a_connection_shut_down_on_our_side_is_not_a_hazard(peer):
    """An integration that ended a pooled connection with shutdown() leaves the fd open, and
    getpeername() answers until the peer's FIN arrives: the check must not count it meanwhile."""
    from refork.process.fork_check import open_connections

    tcp = socket.create_connection(("127.0.0.1", peer))
    try:
        assert [h.fd for h in open_connections() if h.fd == tcp.fileno()] == [tcp.fileno()]
        tcp.shutdown(socket.SHUT_RDWR)
        assert [h for h in open_connections() if h.fd == tcp.fileno()] == []
    finally:
        tcp.close()


def test_client_connections_are_those_accepted_on_the_listeners(tmp_path):
    from refork.process.fork_check import client_connections

    tcp_listener = socket.create_server(("127.0.0.1", 0))
    unix_listener = socket.socket(socket.AF_UNIX)
    unix_listener.bind(str(tmp_path / "http.sock"))
    unix_listener.listen()
    tcp_client = socket.create_connection(tcp_listener.getsockname())
    unix_client = socket.socket(socket.AF_UNIX)
    unix_client.connect(str(tmp_path / "http.sock"))
    tcp_served, _ = tcp_listener.accept()
    unix_served, _ = unix_listener.accept()
    try:
        found = {h.fd for h in client_connections([tcp_listener, unix_listener])}
        assert found == {tcp_served.fileno(), unix_served.fileno()}  # not the client ends
    finally:
        for sock in (tcp_listener, unix_listener, tcp_client, unix_client, tcp_served, unix_served):
            sock.close()
