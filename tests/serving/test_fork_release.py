"""A child forked at a safe point lets go of every client connection it inherited, tracked by the
loop or not (refork.serving.connection.accepted_fds, release_after_fork): one it kept would hold
the connection open after the parent closed it, its client waiting for an answer for ever."""

from __future__ import annotations

import os
import select
import socket
from pathlib import Path

import pytest

from refork.serving.connection import accepted_fds, release_after_fork


def _pair(listener: socket.socket) -> tuple[socket.socket, socket.socket]:
    """(client, accepted) over `listener`."""
    client = socket.socket(listener.family, socket.SOCK_STREAM)
    client.connect(listener.getsockname())
    accepted, _ = listener.accept()
    return client, accepted


def test_the_connections_accepted_from_the_listeners_and_nothing_else(tmp_path: Path) -> None:
    """Accepted connections on a wildcard TCP listener and on a Unix one are found; the listeners,
    a client's own outbound socket, another listener's connections and a socketpair are not."""
    tcp = socket.create_server(("0.0.0.0", 0))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "app.sock"))
    unix.listen()
    other = socket.create_server(("127.0.0.1", 0))
    tcp_client, tcp_accepted = _pair(tcp)
    unix_client, unix_accepted = _pair(unix)
    other_client, other_accepted = _pair(other)
    a, b = socket.socketpair()
    opened = [tcp, unix, other, tcp_client, tcp_accepted, unix_client, unix_accepted, other_client,
              other_accepted, a, b]  # fmt: skip
    try:
        assert sorted(accepted_fds([tcp, unix])) == sorted([tcp_accepted.fileno(), unix_accepted.fileno()])
        assert accepted_fds([other]) == [other_accepted.fileno()]
    finally:
        for sock in opened:
            sock.close()


def test_a_child_lets_go_of_a_connection_no_loop_tracked_yet() -> None:
    """A connection accepted but not yet anybody's (no protocol made) when the worker forks: once the
    child released what accepted_fds found, the parent's close reaches the client (EOF) while the
    child lives on."""
    listener = socket.create_server(("127.0.0.1", 0))
    client, accepted = _pair(listener)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: release, say so, then live until told
        try:
            release_after_fork(accepted_fds([listener]))
            os.write(ready_w, b"r")
            os.read(done_r, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"r"
        accepted.close()  # the parent's close: the client sees it although the child lives
        assert select.select([client], [], [], 5)[0], "the child kept the connection open"
        assert client.recv(1) == b""
    finally:
        os.write(done_w, b"d")
        os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, done_r, done_w):
            os.close(fd)
        for sock in (listener, client):
            sock.close()


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="no dual-stack IPv6 here")
def test_an_ipv4_client_of_a_dual_stack_listener_is_found() -> None:
    listener = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    client = socket.create_connection(("127.0.0.1", listener.getsockname()[1]))
    accepted, _ = listener.accept()
    try:
        assert accepted_fds([listener]) == [accepted.fileno()]
    finally:
        for sock in (listener, client, accepted):
            sock.close()
