"""Descriptor hygiene after a fork (Pitchfork's close_all_ios): what a new process does not need.

A fork copies every descriptor. A file opened at load shares its offset with every worker; a
pipe, an epoll instance or a connection shares its stream. After a fork, each descriptor that is
not refork's, stdio, a log file, a listener, harmless to share or kept with `refork.keep_fd()` is
made harmless: a socket's fd now points at an unconnected socket, anything else at /dev/null. The
number stays taken (never closed) so an object that still holds it fails on its next use instead
of one day writing into a descriptor the number was reused for.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from collections.abc import Iterable

log = logging.getLogger("refork")
O_APPEND = 0o2000
SHARED_KINDS = ("anon_inode:[eventpoll]", "anon_inode:[eventfd]", "anon_inode:[timerfd]",
                "anon_inode:inotify", "anon_inode:[signalfd]", "pipe:")  # fmt: skip


def logging_fds() -> set[int]:
    """Descriptors of every logging handler in this process (refork's and the app's)."""
    fds: set[int] = set()
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            for holder in (getattr(handler, "stream", None), getattr(handler, "socket", None)):
                try:
                    fds.add(int(holder.fileno()))  # type: ignore[union-attr]
                except (AttributeError, OSError, ValueError, TypeError):
                    pass
    return fds


def _flags(fd: int) -> int:
    try:
        with open(f"/proc/self/fdinfo/{fd}") as info:
            for line in info:
                if line.startswith("flags:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0


def _socket_is_shared_stream(fd: int) -> bool:
    """A connected stream socket (a connection, a socketpair end): True; listeners, datagrams: False."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        if sock.type != socket.SOCK_STREAM or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False
        sock.getpeername()
        return True
    except OSError:
        return False  # not connected
    finally:
        sock.detach()


def needs_cleaning(fd: int, target: str) -> str | None:
    """"socket" or "other" when `fd` (pointing at `target`) must not be shared; None to keep it."""
    if target.startswith("socket:"):
        return "socket" if _socket_is_shared_stream(fd) else None
    if target.startswith(SHARED_KINDS):
        return "other"
    if not target.startswith("/") or target.startswith("/memfd:"):
        return None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return None
    if stat.S_ISCHR(mode) or (stat.S_ISREG(mode) and _flags(fd) & O_APPEND):
        return None  # /dev/null, /dev/urandom, a tty; a log file opened for appending
    return "other"


def open_fds() -> dict[int, str]:
    """Every descriptor of this process and what it points at ("pipe:[1234]", "/srv/data.db")."""
    found = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    for name in names:
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own descriptor, or closed since
    return found


_parent_fds: dict[int, str] | None = None


def remember_before_fork() -> None:
    """Called right before a fork: the child cleans only what it inherited, not what a library's
    own fork handler created in it (libuv, for one, makes a new pipe in every child)."""
    global _parent_fds
    _parent_fds = open_fds()


def make_harmless(keep: Iterable[int], who: str, level: int = logging.WARNING) -> list[tuple[int, str]]:
    """Point every inherited descriptor that must not be shared at something harmless; log each."""
    kept = {0, 1, 2, *keep, *logging_fds()}
    cleaned = []
    null = -1
    for fd, target in sorted(open_fds().items()):
        if fd in kept or (_parent_fds is not None and _parent_fds.get(fd) != target):
            continue
        kind = needs_cleaning(fd, target)
        if kind is None:
            continue
        if kind == "socket":
            with socket.socket() as dead:
                os.dup2(dead.fileno(), fd)
        else:
            if null < 0:
                null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            os.dup2(null, fd, inheritable=False)
        cleaned.append((fd, target))
        log.log(level, "fork safety: %s made fd %d harmless (was %s); refork.keep_fd(fd) keeps one", who, fd,
                target)  # fmt: skip
    if null >= 0:
        os.close(null)
    return cleaned
