"""Waits on states a test can observe, instead of sleeping and hoping: a line in a file, a
process's state, a thread asleep in the kernel, a listener's accept queue, a connection whose
sender is blocked on a receiver that does not read. Linux (/proc) only, as the server is."""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

TIMEOUT = 30.0  # generous: the machine is shared and loaded; a wait that holds returns at once


def wait_until(predicate: Callable[[], T], timeout: float = TIMEOUT, what: str = "condition") -> T:
    """The predicate's first true value, polled every 20 ms; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def wait_for_line(path: Path, prefix: str, timeout: float = TIMEOUT) -> str:
    """The first line of `path` that starts with `prefix`, once one is there."""

    def line() -> str | None:
        if path.exists():
            for text in path.read_text().splitlines():
                if text.startswith(prefix):
                    return text
        return None

    try:
        return wait_until(line, timeout, f"a line {prefix!r} in {path}")
    except AssertionError:
        raise AssertionError(
            f"no line {prefix!r} in {path}: {path.read_text() if path.exists() else '(no file)'!r}"
        ) from None


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, Z, ...); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


# The system calls a thread sleeps in: time.sleep (clock_nanosleep; select before Python 3.11),
# usleep (nanosleep or clock_nanosleep).
_SLEEPS = {
    "x86_64": {35, 230, 23, 270},  # nanosleep, clock_nanosleep, select, pselect6
    "aarch64": {101, 115, 72},  # nanosleep, clock_nanosleep, pselect6
}[platform.machine()]


def sleeping_threads(pid: int) -> int:
    """How many threads of `pid` are blocked in a sleep system call now (an app in time.sleep)."""
    count = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                first = f.read().split(maxsplit=1)[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if first.isdigit() and int(first) in _SLEEPS:
            count += 1
    return count


_LISTEN, _TIME_WAIT = "0A", "06"
_WAITING_ON_PEER = ("01", "04")  # /proc/net/tcp's timer: retransmit, zero-window probe


def _tcp_rows() -> list[tuple[int, int, str, int, int, str, str]]:
    """(local port, remote port, state, tx queue, rx queue, timer, inode) of every TCP socket here."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            tx, rx = (int(x, 16) for x in fields[4].split(":"))
            local, remote = (int(a.rpartition(":")[2], 16) for a in fields[1:3])
            rows.append((local, remote, fields[3], tx, rx, fields[5].partition(":")[0], fields[9]))
    return rows


def unread(port: int, client: int) -> int:
    """Bytes the client at local port `client` sent to the server on `port` that the server has not
    read yet: unacknowledged on the client's side, or in the server's receive queue."""
    return sum(tx if local == client else rx for local, remote, _, tx, rx, *_ in _tcp_rows()
               if (local, remote) in ((client, port), (port, client)))  # fmt: skip


def accept_queue(port: int) -> int:
    """Connections the kernel completed on the listener(s) of `port` that no one accepted yet."""
    return sum(rx for local, _, state, _, rx, *_ in _tcp_rows() if local == port and state == _LISTEN)


def served_connections(port: int) -> int:
    """Connections on the server side of `port` not yet closed by the server (any state but
    LISTEN and TIME_WAIT): accepted or queued, including those the client already closed."""
    gone = (_LISTEN, _TIME_WAIT)
    return sum(1 for local, _, state, *_ in _tcp_rows() if local == port and state not in gone)


def listener_inode(port: int) -> str:
    """The inode of the TCP listener on `port` (one listener: the server's own)."""
    for local, _, state, *_, inode in _tcp_rows():
        if local == port and state == _LISTEN:
            return inode
    raise AssertionError(f"no listener on port {port}")


def holds_socket(pid: int, inode: str) -> bool:
    """Whether process `pid` has the socket `inode` open (False once it has exited)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]" for fd in fds)
    except FileNotFoundError:
        return False


def sender_blocked(client: socket.socket) -> bool:
    """The server's end of this client's connection holds bytes the client has not taken, and
    waits on it (a zero-window probe or retransmit timer armed: on loopback only a receiver with a
    full buffer leaves bytes unacknowledged), while the client's own queue holds unread bytes."""
    ours, theirs = client.getsockname()[1], client.getpeername()[1]
    rows = _tcp_rows()
    server_waits = any(
        local == theirs and remote == ours and tx > 0 and timer in _WAITING_ON_PEER
        for local, remote, _, tx, _, timer, _ in rows
    )
    client_full = any(local == ours and remote == theirs and rx > 0 for local, remote, _, _, rx, *_ in rows)
    return server_waits and client_full
