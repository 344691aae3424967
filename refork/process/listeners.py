"""Bind the listening sockets once, in the monitor, for the server's whole life."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat

from refork.config import ConfigError


def parse_address(text: str) -> tuple[int, object]:
    """Return (family, address) for HOST:PORT, [V6]:PORT, :PORT, unix:PATH or fd://N."""
    if text.startswith("unix:"):
        path = text[5:]
        if not path:
            raise ConfigError(f"bind address {text!r} has no path: use unix:/path/to/socket")
        return socket.AF_UNIX, path
    if text.startswith("fd://"):
        try:
            return -1, int(text[5:])
        except ValueError:
            raise ConfigError(f"bind address {text!r}: fd:// needs a file descriptor number") from None
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ConfigError(f"bind address {text!r}: write IPv6 addresses as [::1]:8000")
        return socket.AF_INET6, (host, _port(port, text))
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "8000"
    if ":" in host:
        raise ConfigError(f"bind address {text!r}: write IPv6 addresses as [{host}]:{port}")
    return socket.AF_INET, (host or "0.0.0.0", _port(port, text))


def _port(port: str, text: str) -> int:
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"bind address {text!r}: the port must be a number from 0 to 65535")
    return int(port)


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


def _bind_one(text: str, backlog: int) -> socket.socket:
    family, address = parse_address(text)
    if family == -1:
        try:
            sock = socket.socket(fileno=address)  # type: ignore[arg-type]
        except OSError as e:
            raise ConfigError(f"cannot use {text}: {e.strerror}; pass a listening socket's fd") from None
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 0:
            sock.listen(backlog)
        sock.setblocking(False)
        return sock
    if family == socket.AF_UNIX:
        _remove_stale_unix_socket(str(address), text)
    elif family == socket.AF_INET:
        with contextlib.suppress(OSError):
            # A host name: resolve it once (the monitor is single-threaded, nothing forks yet).
            infos = socket.getaddrinfo(address[0], address[1], type=socket.SOCK_STREAM)  # type: ignore[index]
            family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
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
