"""TERM with --shutdown-delay: readiness fails first, then the stop, and nothing queued is lost."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import ssl
import struct
import threading
import time

import pytest
from conftest import read_to_end
from support.request_paths import PATHS, flags, http2, path_certs
from support.waits import holds_socket, listener_inode

HEALTH = "/_h"
WSGI = "apps.lifecycle_apps:wsgi"
ASGI = "apps.lifecycle_apps:asgi"


def send(port: int, path: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    return sock


@pytest.mark.parametrize("app", [WSGI, ASGI], ids=["wsgi", "asgi"])
def test_term_serves_every_connection_queued_in_the_backlog(start_server, app):
    """1 worker whose loop is held by a slow request; a dozen connections wait in the kernel's
    accept queue behind it; TERM (with a delay): every one gets its whole response."""
    server = start_server("--shutdown-delay", "0.5", "--graceful-timeout", "20", app=app, workers=1)
    first = send(server.port, "/block?3")
    server.wait_for(lambda: server.workers()[0]["busy"] == 1, what="the worker's loop in the app")
    queued = [send(server.port, f"/q{i}") for i in range(12)]
    server.signal(signal.SIGTERM)
    assert read_to_end(first).startswith(b"HTTP/1.1 200 OK")
    replies = [read_to_end(sock) for sock in queued]
    for i, reply in enumerate(replies):
        assert reply.startswith(b"HTTP/1.1 200 OK") and f"/q{i} ".encode() in reply, (i, reply, server.log())
    assert server.wait_exit() == 0
    log = server.log()
    assert "--shutdown-delay" in log and "graceful stop" in log


@pytest.mark.parametrize(("app", "threads"), [(WSGI, "4"), (ASGI, "1")], ids=["wsgi", "asgi"])
def test_readiness_fails_during_the_delay_while_the_app_and_liveness_serve(start_server, app, threads):
    server = start_server("--shutdown-delay", "3", "--health-path", HEALTH, "--threads", threads,
                          app=app, workers=2)  # fmt: skip
    server.wait_for(lambda: server.get(f"{HEALTH}/ready")[0] == 200, what="readiness")
    server.signal(signal.SIGTERM)
    server.wait_for(lambda: server.get(f"{HEALTH}/ready") == (503, b"unavailable\n"), what="readiness off")
    assert server.get(f"{HEALTH}/live") == (200, b"ok\n")
    assert server.get("/app")[0] == 200
    assert server.proc.poll() is None  # still serving
    assert server.wait_exit() == 0
    log = server.log()
    assert log.index("server draining") < log.index("graceful stop")


def test_load_through_term_with_a_delay_loses_nothing(start_server):
    server = start_server("--shutdown-delay", "1", "--threads", "2", app=WSGI, workers=2)
    failures: list[str] = []
    done = [0]
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            except ConnectionRefusedError:
                return  # the listeners are closed: the server is gone (not a lost request)
            try:
                sock.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                reply = read_to_end(sock)
            except OSError as e:  # a connection the kernel had accepted, then reset: lost
                reply = repr(e).encode()
            finally:
                sock.close()
            if not reply.startswith(b"HTTP/1.1 200 OK"):
                failures.append(repr(reply))
                return
            done[0] += 1

    clients = [threading.Thread(target=client) for _ in range(6)]
    for t in clients:
        t.start()
    server.wait_for(lambda: done[0] > 50, what="load")
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    stop.set()
    for t in clients:
        t.join()
    assert failures == [], server.log()


@pytest.mark.parametrize("app", [WSGI, ASGI], ids=["wsgi", "asgi"])
def test_a_connection_accepted_before_the_stop_gets_its_first_request_answered(start_server, app):
    """A client that connected but had not sent yet when the stop began: its connection keeps its
    --keepalive clock, not the 1 s drain grace of idle keep-alive connections (it was closed
    unanswered, once, in the load-through-TERM test above on a loaded machine)."""
    server = start_server("--graceful-timeout", "20", app=app, workers=1)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    server.wait_for(lambda: server.get("/ping")[0] == 200, what="the worker")  # it has accepted sock
    server.signal(signal.SIGTERM)
    server.wait_for(lambda: "graceful stop" in server.log(), what="the stop")
    time.sleep(2.0)  # (the input, not a wait) silent past the 1 s drain grace, within --keepalive (5 s)
    sock.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_to_end(sock).startswith(b"HTTP/1.1 200 OK")
    sock.close()
    assert server.wait_exit() == 0


def test_a_second_term_during_the_delay_stops_at_once(start_server):
    server = start_server("--shutdown-delay", "60", app="apps.lifecycle_apps:wsgi", workers=1)
    server.signal(signal.SIGTERM)
    server.wait_for(lambda: "server draining" in server.log(), what="the delay")
    assert server.get("/still")[0] == 200
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=20) == 0
    assert "graceful stop requested during --shutdown-delay: stopping now" in server.log()


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_a_sealed_listener_keeps_its_queue_and_takes_no_new_connection(tmp_path, kind):
    """What the monitor does to the listeners it bound at a graceful stop: the queued connection
    (its request already sent) is still accepted; a new one is not: its SYN is dropped (TCP: the
    client would retry, then be refused) or it is refused at once (unix)."""
    from refork.process.listeners import bind, seal

    [listener] = bind(["127.0.0.1:0" if kind == "tcp" else f"unix:{tmp_path}/s"], 16)
    family = listener.family
    queued = socket.socket(family)
    queued.connect(listener.getsockname())
    queued.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert seal(listener)
    late = socket.socket(family)
    late.settimeout(0.3)
    with pytest.raises(TimeoutError if kind == "tcp" else ConnectionRefusedError):
        late.connect(listener.getsockname())
    conn, _ = listener.accept()
    assert conn.recv(100) == b"GET / HTTP/1.1\r\n\r\n"
    with pytest.raises(BlockingIOError):
        listener.accept()
    for sock in (conn, queued, late, listener):
        sock.close()


# A cBPF filter that drops every segment but a SYN: the handshake's last ACK never arrives, so the
# client's connect() returns while the server's kernel holds the connection in SYN-RECV, not in
# the accept queue: what a handshake under way at the moment of the seal looks like, held open.
_ONLY_SYN = struct.pack("HBBI" * 4, 0x30, 0, 0, 13, 0x45, 0, 1, 0x02, 0x06, 0, 0, 0xFFFFFFFF, 0x06, 0, 0, 0)


def _hold_handshakes(listener: socket.socket) -> None:
    from refork.process.listeners import attach_filter

    attach_filter(listener, _ONLY_SYN)


def _listener_of(pid: int, port: int) -> socket.socket:
    """A copy of the server's listening socket, taken from the monitor with pidfd_getfd(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                continue
            fd = libc.syscall(438, pidfd, int(name), 0)  # SYS_pidfd_getfd
            if fd < 0:
                continue
            sock = socket.socket(fileno=fd)
            inet = sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            if inet and listening and sock.getsockname()[1] == port:
                return sock
            sock.close()
    finally:
        os.close(pidfd)
    raise AssertionError("no listener found")


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_handshake_under_way_at_the_stop_is_served(start_server, threads):
    """A client whose handshake the server's kernel has not finished when TERM arrives (its last
    ACK in flight) already holds a connected socket and has sent its request: the graceful stop
    waits for the handshake to land in the backlog, and a worker serves it. (Sealing with a
    filter that dropped that ACK too left it out of the backlog: reset when the listener closed.)"""
    from refork.process.listeners import handshakes_in_flight

    server = start_server("--threads", threads, app=WSGI, workers=1)
    listener = _listener_of(server.proc.pid, server.port)
    _hold_handshakes(listener)
    client = send(server.port, "/held")
    ports = [(socket.AF_INET, server.port)]
    server.wait_for(lambda: handshakes_in_flight(ports) == 1, what="a handshake held in SYN-RECV")
    server.signal(signal.SIGTERM)
    reply = read_to_end(client)
    assert reply.startswith(b"HTTP/1.1 200 OK") and b"/held" in reply, (reply, server.log())
    assert server.wait_exit() == 0
    client.close()
    listener.close()


def test_only_listeners_bound_by_the_server_are_sealed():
    """An fd:// socket belongs to whoever passed it (it may outlive us): never sealed."""
    from refork.process.listeners import owned

    a, b = socket.socket(), socket.socket()
    assert owned(["127.0.0.1:8000", "fd://3"], [a, b]) == [a]
    a.close()
    b.close()


def _whole(response: bytes) -> bool:
    """Whether `response` holds a whole HTTP/1.1 response with a Content-Length."""
    head, sep, body = response.partition(b"\r\n\r\n")
    fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:] if b": " in line)
    return bool(sep) and len(body) >= int(fields.get(b"content-length", b"0"))


@pytest.mark.parametrize("path", [p for p in PATHS if not http2(p)])
def test_a_tls_handshake_under_way_at_the_stop_is_finished_and_served(start_server, path):
    """A client whose TLS handshake a worker has begun (the server's flight sent, the client's
    Finished not arrived) when TERM comes: the drain waits for it as for an idle connection, for
    the drain's grace, and the request that follows it is served."""
    args, app = flags(path, "apps.lifecycle_apps")
    server = start_server(*args, *path_certs().args(), app=app, workers=1)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = path_certs().client_context().wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    sock.sendall(outgoing.read())  # the ClientHello
    while True:  # the server's flight, up to its Finished: the worker is in the handshake
        incoming.write(sock.recv(65536))
        try:
            tls.do_handshake()
            break  # (TLS 1.3: done on this side; the server waits for the client's Finished)
        except ssl.SSLWantReadError:
            continue
    worker, listener = server.workers()[0]["pid"], listener_inode(server.port)
    server.signal(signal.SIGTERM)
    # the worker lets go of the listener when its drain begins (or is gone, if it did not wait)
    server.wait_for(lambda: not holds_socket(worker, listener), what="the worker's drain")
    tls.write(b"GET /held HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    sock.sendall(outgoing.read())  # the client's Finished, then the request
    reply = b""
    while not _whole(reply):  # (not to the close: before 3.11 the server's TLS close waits for the
        incoming.write(sock.recv(65536))  # client's close_notify, up to 30 s)
        try:
            while chunk := tls.read(65536):
                reply += chunk
        except (ssl.SSLWantReadError, ssl.SSLZeroReturnError, ssl.SSLEOFError):
            pass
    assert reply.startswith(b"HTTP/1.1 200 OK") and b"/held" in reply, (reply, server.log())
    sock.close()
    assert server.wait_exit() == 0
