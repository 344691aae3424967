"""StatsD / DogStatsD: gunicorn's metrics arrive at a real UDP (or unix datagram) listener.

refork runs with --statsd-host pointing at a socket of the test; requests go to the server (on
every request path, in HTTP/2 on the HTTP/2 paths); the datagrams that arrive must carry
gunicorn's names and types under the prefix, the counts of what was sent, one duration per
request, the worker gauge, the log counters, refork's memory gauges and the DogStatsD tags. The
pure parts (prefix, line format, datagram packing, settings) are checked without a server.
A host name is looked up through a resolver of the test's own: the server runs in a mount
namespace whose /etc/hosts and /etc/resolv.conf are the test's files.
"""

from __future__ import annotations

import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import time
from collections import Counter

import pytest
from conftest import read_to_end
from support import h2client
from support.request_paths import connect, every_path, flags, http2, tls
from support.waits import wait_until

from refork.addresses import TcpAddress, UnixAddress, parse_statsd
from refork.config import ConfigError, load_config
from refork.process.statsd import Format, datagrams, prefix_of

LINE = re.compile(
    r"(?P<name>[^:|]+):(?P<value>[^|]+)\|(?P<type>c|g|ms)(?:\|@(?P<rate>[\d.]+))?(?:\|#(?P<tags>.*))?"
)



class Listener:
    """A datagram socket of the test: every line that arrives, parsed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.settimeout(0.2)
        self.lines: list[dict] = []

    def receive_until(self, done, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while not done(self.lines):
            assert time.monotonic() < deadline, f"metrics so far: {self.lines}"
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            for line in data.decode("ascii").split("\n"):
                m = LINE.fullmatch(line)
                assert m, line
                self.lines.append(m.groupdict())
        return self.lines

    def total(self, name: str) -> float:
        return sum(float(x["value"]) for x in self.lines if x["name"] == name)


@pytest.fixture
def udp():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    yield Listener(sock)
    sock.close()


def _get(port: int, target: str, path: str | None = None) -> int:
    """GET `target` on a connection of its own, as the request path's clients send it (over TLS on
    a TLS path, in HTTP/2 on an HTTP/2 path; HTTP/1.1 without one): the status."""
    if path is not None and http2(path):
        return h2client.get(port, target, tls=tls(path))[0]
    with connect(path, port) if path else socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return int(read_to_end(sock).split()[1])


@every_path
def test_gunicorns_metrics_arrive(path, udp, start_server):
    args, app = flags(path, "apps.access_apps")
    port = udp.sock.getsockname()[1]
    server = start_server(
        *args, "--statsd-host", f"127.0.0.1:{port}", "--statsd-prefix", "app", "--dogstatsd-tags",
        "env:test,team:web", "--memory-interval", "1", app=app, workers=1,
    )  # fmt: skip
    sent = Counter(_get(server.port, p, path) for p in ["/"] * 5 + ["/missing"] * 2 + ["/boom"])
    assert sent == {200: 5, 404: 2, 500: 1}

    def done(lines):
        names = {x["name"] for x in lines}
        return (udp.total("app.gunicorn.requests") >= 8 and "app.gunicorn.log.exception" in names
                and "app.refork.worker.0.memory.uss" in names)  # fmt: skip

    lines = udp.receive_until(done)
    assert all(x["tags"] == "env:test,team:web" for x in lines)
    assert all(x["name"].startswith(("app.gunicorn.", "app.refork.")) for x in lines)
    kinds = {x["name"]: x["type"] for x in lines}
    assert kinds["app.gunicorn.requests"] == "c" and kinds["app.gunicorn.workers"] == "g"
    assert kinds["app.gunicorn.request.duration"] == "ms" and kinds["app.refork.worker.0.memory.uss"] == "g"
    assert udp.total("app.gunicorn.requests") == 8
    assert udp.total("app.gunicorn.request.status.200") == 5
    assert udp.total("app.gunicorn.request.status.404") == 2
    assert udp.total("app.gunicorn.request.status.500") == 1
    durations = [x for x in lines if x["name"] == "app.gunicorn.request.duration"]
    assert len(durations) == 8
    assert all(x["rate"] is None and 0 <= float(x["value"]) < 10_000 for x in durations)
    assert udp.total("app.gunicorn.log.exception") == 1  # the app's error, logged with its traceback
    assert [x["value"] for x in lines if x["name"] == "app.gunicorn.workers"][-1] == "1"
    assert all(x["rate"] == "1.0" for x in lines if x["type"] == "c")
    assert int(next(x["value"] for x in lines if x["name"] == "app.refork.worker.0.memory.uss")) > 1 << 20


def test_unix_datagram_socket(tmp_path, start_server):
    path = str(tmp_path / "statsd.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    listener = Listener(sock)
    try:
        server = start_server("--statsd-host", f"unix:{path}", app="apps.access_apps:wsgi", workers=2)
        for _ in range(3):
            assert _get(server.port, "/") == 200
        lines = listener.receive_until(lambda lines: listener.total("gunicorn.requests") >= 3)
        assert listener.total("gunicorn.requests") == 3  # no prefix: gunicorn's bare names
        assert all(x["tags"] is None for x in lines)
        assert [x["value"] for x in lines if x["name"] == "gunicorn.workers"][-1] == "2"
    finally:
        sock.close()


def test_no_listener_costs_nothing_but_the_lost_lines(start_server):
    """Nothing listens on the StatsD port: requests are served, nothing is logged at info or above."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: a port where nothing listens
    server = start_server("--statsd-host", f"127.0.0.1:{port}", app="apps.access_apps:wsgi", workers=1)
    for _ in range(3):
        assert _get(server.port, "/") == 200
    server.wait_for(lambda: "statsd: metrics to" in server.log(), what="the start line")
    assert "Traceback" not in server.log()


def test_lines_and_datagrams():
    assert [prefix_of(p) for p in ("", "app", "app...", "a")] == ["", "app.", "app.", "a."]
    fmt = Format("app.", "env:prod")
    assert fmt.count("gunicorn.requests", 3) == "app.gunicorn.requests:3|c|@1.0|#env:prod"
    assert fmt.gauge("gunicorn.workers", 2) == "app.gunicorn.workers:2|g|#env:prod"
    assert Format().timer("gunicorn.request.duration", 1.5) == "gunicorn.request.duration:1.5|ms"
    assert Format().timer("gunicorn.request.duration", 1.5, 0.25) == "gunicorn.request.duration:1.5|ms|@0.25"
    packed = datagrams(["x" * 600, "y" * 600, "z" * 600, "w" * 2000])
    assert [len(d) for d in packed] == [1201, 600, 2000]
    assert packed[0] == b"x" * 600 + b"\n" + b"y" * 600


def test_addresses_and_settings():
    assert parse_statsd("localhost") == TcpAddress("localhost", 8125, False)
    assert parse_statsd("10.0.0.1:9125") == TcpAddress("10.0.0.1", 9125, False)
    assert parse_statsd("[::1]:9125") == TcpAddress("::1", 9125, True)
    assert parse_statsd("unix:/run/statsd.sock") == UnixAddress("/run/statsd.sock")
    assert parse_statsd("unix:///run/statsd.sock") == UnixAddress("/run/statsd.sock")
    assert parse_statsd("unix:8125") == TcpAddress("unix", 8125, False)  # gunicorn's reading
    config = load_config(["--statsd-host", "localhost:9125", "--statsd-prefix", "web", "--dogstatsd-tags",
                          "env:prod", "m:app"], environ={})  # fmt: skip
    assert config.statsd_host == "localhost:9125"
    assert (config.statsd_prefix, config.dogstatsd_tags) == ("web", "env:prod")
    for argv, error in (
        (["--statsd-host", "host:99999"], "is not a StatsD address"),
        (["--statsd-host", "unix:"], "is not a StatsD address"),
        (["--dogstatsd-tags", "a|b"], "must be comma-separated ASCII tags"),
        (["--dogstatsd-tags", "a,,b"], "must be comma-separated ASCII tags"),
    ):
        with pytest.raises(ConfigError, match=re.escape(error)):
            load_config([*argv, "m:app"], environ={})


CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x20000, 0x1000, 0x4000, 0x40000
NAME = "statsd.refork.test"


@pytest.fixture
def own_resolver(tmp_path):
    """preexec_fn(hosts, nameserver): the server sees these as /etc/hosts and /etc/resolv.conf,
    in a mount namespace of its own (skipped where one cannot be made)."""
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it

    def preexec_fn(hosts: str, nameserver: str):
        files = []
        for name, text in (("hosts", hosts), ("resolv.conf", f"nameserver {nameserver}\n"
                                                             "options timeout:30 attempts:1\n")):  # fmt: skip
            (tmp_path / name).write_text(text)
            files.append((str(tmp_path / name).encode(), f"/etc/{name}".encode()))

        def enter() -> None:
            if libc.unshare(CLONE_NEWNS) or libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None):
                raise OSError(ctypes.get_errno(), "no mount namespace")
            for source, target in files:
                if libc.mount(source, target, None, MS_BIND, None):
                    raise OSError(ctypes.get_errno(), f"cannot bind {target.decode()}")

        return enter

    probe = preexec_fn("", "127.0.0.1")
    try:
        subprocess.run(["true"], preexec_fn=probe, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"no mount namespace here: {e}")
    return preexec_fn


@pytest.fixture
def silent_dns():
    """A DNS server that never answers: a UDP socket on port 53 of a loopback address of its own."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(20):
        address = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
        try:
            sock.bind((address, 53))
            break
        except OSError:
            continue
    sock.settimeout(0.2)
    yield sock
    sock.close()


def test_a_host_name_is_resolved_and_its_metrics_arrive(udp, own_resolver, start_server):
    port = udp.sock.getsockname()[1]
    preexec = own_resolver(f"127.0.0.1 {NAME}\n", "127.0.0.1")
    server = start_server("--statsd-host", f"{NAME}:{port}", app="apps.access_apps:wsgi", workers=1,
                          preexec_fn=preexec)  # fmt: skip
    for _ in range(3):
        assert _get(server.port, "/") == 200
    udp.receive_until(lambda lines: udp.total("gunicorn.requests") >= 3)
    assert udp.total("gunicorn.requests") == 3


def test_a_resolver_that_never_answers_never_holds_up_the_monitor(own_resolver, silent_dns, start_server):
    """Its lookup waits 30 s a try: the monitor starts, answers and replaces a killed worker meanwhile,
    drops the metrics it cannot send, and says so."""
    preexec = own_resolver("127.0.0.1 localhost\n", silent_dns.getsockname()[0])
    begun = time.monotonic()
    server = start_server("--statsd-host", NAME, app="apps.access_apps:wsgi", workers=1, wait=False,
                          preexec_fn=preexec)  # fmt: skip
    (worker,) = server.wait_ready(1, timeout=15)
    query = silent_dns.recv(512)  # the lookup is under way, and hangs
    assert NAME.split(".")[0].encode() in query
    assert time.monotonic() - begun < 15
    asked = time.monotonic()
    assert server.status()["workers"] == 1
    assert time.monotonic() - asked < 3
    killed = time.monotonic()
    os.kill(worker["pid"], signal.SIGKILL)
    server.wait_ready(1, timeout=5)  # the 30 s lookup is still under way
    wait_until(lambda: [w for w in server.workers() if w["pid"] != worker["pid"]], 5, "a new worker")
    assert time.monotonic() - killed < 5
    assert _get(server.port, "/") == 200
    server.wait_for(lambda: f"statsd: cannot resolve {NAME} yet (no answer in" in server.log(), 10,
                    "the warning")  # fmt: skip
    server.signal(signal.SIGTERM)
    assert server.wait_exit(10) == 0
    log = server.log()
    assert "metrics are dropped until it resolves" in log and "Traceback" not in log
    assert re.search(rf"statsd: {NAME} never resolved: \d+ metric lines dropped", log), log
