"""Whatever the control socket is sent, the monitor answers or closes, and carries on serving.

Random bytes, JSON nested deeper than Python recurses, lines longer than a request may be,
clients that trickle, clients that never ask, more clients than it serves at once, and accept()
failing for want of descriptors: after each, `refork status` answers and the app still serves.
"""

from __future__ import annotations

import json
import random
import resource
import socket
import time

import pytest

APP = "apps.procs:app"


def ask(path: str, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send `payload` on a fresh connection; what comes back until the server closes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        try:
            s.sendall(payload)
            s.shutdown(socket.SHUT_WR)  # all of it: the server answers what it got
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered (and closed) before all of it was sent: a line that was too long
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def still_fine(server) -> None:
    assert server.proc.poll() is None, server.log()[-2000:]
    assert server.status()["ok"] is True
    assert server.get("/")[0] == 200


@pytest.mark.parametrize(
    "payload",
    [
        b"[" * 60000 + b"\n",  # deeper than the interpreter recurses (RecursionError in json)
        b'{"command": ' + b"[" * 30000 + b"]" * 30000 + b"}\n",
        b'{"command": {"a": 1}}\n',
        b'{"command": null}\n',
        b"[1, 2, 3]\n",
        b'"status"\n',
        b"\xff\xfe\x00garbage\n",
        b"x" * 200_000,  # longer than a request may be, no newline
        b"",  # connect and close
    ],
    ids=["deep-array", "deep-command", "dict-command", "null-command", "a-list", "a-string", "bytes",
         "huge-line", "nothing"],  # fmt: skip
)
def test_a_malformed_request_gets_an_error_answer_and_the_monitor_carries_on(start_server, payload):
    server = start_server(workers=1, app=APP)
    answer = ask(server.control, payload)
    if payload:
        reply = json.loads(answer)
        assert reply["ok"] is False and "bad request" in reply["error"], reply
    still_fine(server)


def test_random_bytes_never_take_the_monitor_down(start_server):
    server = start_server(workers=1, app=APP)
    rng = random.Random(1234)
    for _ in range(150):
        size = rng.choice([1, 7, 100, 5000, 70000])
        payload = bytes(rng.getrandbits(8) for _ in range(size))
        if rng.random() < 0.5:
            payload += b"\n"
        ask(server.control, payload)
    still_fine(server)


def test_idle_and_trickling_clients_are_timed_out_and_never_block_a_command(start_server):
    server = start_server(workers=1, app=APP)
    idle = []
    for _ in range(1000):  # more than it serves at once: the rest wait in the listen backlog
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(server.control)
        except (BlockingIOError, OSError):
            s.close()
            continue
        idle.append(s)
    trickler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    trickler.connect(server.control)
    for byte in b'{"comm':
        trickler.send(bytes([byte]))
    started = time.monotonic()
    server.wait_for(lambda: server.status()["ok"], timeout=30, what="a status answer past the idle clients")
    # the idle ones were cut after the client timeout (5 s), not served forever
    assert time.monotonic() - started < 25
    trickler.settimeout(10)
    assert trickler.recv(100) == b""  # cut without an answer: it never finished its request
    for s in idle:
        s.close()
    trickler.close()
    still_fine(server)
    assert "Traceback" not in server.log()


def test_accept_failing_for_want_of_descriptors_pauses_it_and_the_monitor_carries_on(start_server):
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (40, 40))

    server = start_server(workers=1, app=APP, preexec_fn=low_limit)
    held: list[socket.socket] = []

    def one_more() -> bool:  # a connection that waits in the backlog until the monitor takes it
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(server.control)
            held.append(s)
        except OSError:  # the backlog is full: the monitor takes some first
            s.close()
        return "accept() failed" in server.log()

    server.wait_for(one_more, timeout=20, what="accept() to fail for want of descriptors")
    for s in held:
        s.close()
    server.wait_for(lambda: server.status()["ok"], timeout=30, what="a status answer once they left")
    still_fine(server)
    assert server.log().count("control socket: accept() failed") <= 30  # once a second at most
