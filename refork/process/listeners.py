"""Bind the listening sockets once, in the monitor, for the server's whole life."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import stat
import struct
from typing import Any

from refork.addresses import BIND_SYNTAX, FdAddress, TcpAddress, UnixAddress, parse_bind
from refork.errors import ConfigError

_SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>; the socket module does not export it
_DROP_ALL = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))  # cBPF: ret #0


def bind(addresses: list[str], backlog: int) -> list[socket.socket]:
    """Bind and listen on every address, or raise ConfigError saying which one failed and why."""
    listeners = []
    try:
        for text in addresses:
            listeners.append(_bind_one(text, backlog))
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def owned(addresses: list[str], listeners: list[socket.socket]) -> list[socket.socket]:
    """The listeners :func:`bind` made itself (not ``fd://``): closing the last copy ends them."""
    pairs = zip(listeners, addresses, strict=True)
    return [sock for sock, text in pairs if not isinstance(parse_bind(text), FdAddress)]


def seal(sock: socket.socket) -> bool:
    """Drop every packet a listener gets from now on (a classic BPF "return 0" filter).

    At a graceful stop the workers take the backlog and close; a connection queued between the
    last ``accept()`` and the last ``close()`` would be reset, its request sent and lost. Sealed,
    a new SYN (and the last ACK of a half-done handshake) is dropped, so what is queued is all
    there will be. A client whose SYN was dropped retries and then sees "connection refused",
    which, unlike a reset, tells it nothing was served. The filter is on the socket, shared by
    every process holding it; only for listeners we own (a systemd socket outlives us).
    """
    prog = struct.pack("@HP", 1, ctypes.addressof(_DROP_ALL))
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, prog)
    except OSError:
        return False
    return True


def activated(fds: list[tuple[int, str]], backlog: int) -> list[socket.socket]:
    """Systemd socket activation: the sockets passed as (fd, name), used as they are."""
    listeners = []
    try:
        for fd, name in fds:
            listeners.append(_inherited(fd, f"the socket-activated fd {fd} ({name})", backlog))
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def _bind_one(text: str, backlog: int) -> socket.socket:
    try:
        address = parse_bind(text)
    except ValueError:  # config validation parses the same way: only a Config built by hand gets here
        raise ConfigError(f"bind address {text!r} is not a valid address; use {BIND_SYNTAX}") from None
    if isinstance(address, FdAddress):
        return _inherited(address.fd, text, backlog)
    family, sockaddr = _resolve(address, text)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as e:
        sock.close()
        hint = {
            errno.EADDRINUSE: "another process is listening there; stop it or pick another -b/--bind",
            errno.EACCES: "ports below 1024 need privileges; pick a port above 1024",
            errno.EADDRNOTAVAIL: "that address is not on this machine; use 127.0.0.1 or 0.0.0.0",
        }.get(e.errno or 0, "check the -b/--bind address")
        raise ConfigError(f"cannot bind {text}: {e.strerror}; {hint}") from None
    sock.setblocking(False)
    return sock


def _inherited(fd: int, text: str, backlog: int) -> socket.socket:
    """fd://N: a socket our parent (systemd, a supervisor) opened; listen on it if it does not yet."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as e:
        raise ConfigError(f"cannot use {text}: {e.strerror}; pass a listening socket's fd") from None
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0:
        sock.listen(backlog)
    sock.setblocking(False)
    return sock


def _resolve(address: TcpAddress | UnixAddress, text: str) -> tuple[int, str | tuple[Any, ...]]:
    """(family, socket address) to bind; a host name is resolved once, here in the monitor."""
    if isinstance(address, UnixAddress):
        _remove_stale_unix_socket(address.path, text)
        return socket.AF_UNIX, address.path
    if address.ipv6:
        return socket.AF_INET6, (address.host, address.port)
    with contextlib.suppress(OSError):  # the monitor is single-threaded and nothing forked yet
        family, _, _, _, sockaddr = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)[0]
        return family, sockaddr
    return socket.AF_INET, (address.host, address.port)


def _remove_stale_unix_socket(path: str, text: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"cannot bind {text}: {path} exists and is not a socket; remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a leftover from a previous run
        return
    finally:
        probe.close()
    raise ConfigError(f"cannot bind {text}: another server is listening on {path}")


def describe(sock: socket.socket) -> str:
    if sock.family == socket.AF_UNIX:
        return f"unix:{sock.getsockname()}"
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"
