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

from refork.addresses import BIND_SYNTAX, BindAddress, FdAddress, TcpAddress, UnixAddress, parse_bind
from refork.errors import ConfigError

_SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>; the socket module does not export it
# cBPF on the TCP header: a segment with SYN set (a new connection) returns 0 (dropped), any other
# returns the whole length (kept): "ldb [13]; jset #SYN, 0, 1; ret #0; ret #-1"
_DROP_SYN = struct.pack("HBBI" * 4, 0x30, 0, 0, 13, 0x45, 0, 1, 0x02, 0x06, 0, 0, 0, 0x06, 0, 0, 0xFFFFFFFF)
_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY = 4, 20  # <linux/netlink.h>, <linux/sock_diag.h>
_NLM_F_REQUEST, _NLM_F_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 0x1, 0x300, 2, 3
_SYN_RECV = (1 << 3) | (1 << 12)  # TCPF_SYN_RECV | TCPF_NEW_SYN_RECV: a SYN answered, no ACK yet

Port = tuple[int, int]  # (address family, TCP port) of a listener


def bind(addresses: list[str], backlog: int, reuse_port: bool = False) -> list[socket.socket]:
    """Bind and listen on every address, or raise ConfigError saying which one failed and why.
    reuse_port: SO_REUSEPORT on TCP listeners (another server may bind the same port).

    An IPv6 listener is dual-stack, as gunicorn's (``[::]:5000`` serves IPv4 clients too), unless
    an IPv4 address is also bound on its port: then it is IPv6-only, or the two would collide."""
    parsed = [_parsed(text) for text in addresses]
    ipv4_ports = {a.port for a in parsed if isinstance(a, TcpAddress) and not a.ipv6 and a.port}
    listeners = []
    try:
        for text in addresses:
            listeners.append(_bind_one(text, backlog, reuse_port, ipv4_ports))
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
    """Take no new connection on a listener from now on, keeping those already queued.

    At a graceful stop the workers take the backlog and close; a connection queued between the
    last ``accept()`` and the last ``close()`` would be reset, its request sent and lost. A sealed
    TCP listener drops every SYN (a classic BPF filter) but still lets a handshake already under
    way complete (see :func:`handshakes_in_flight`); a client whose SYN was dropped retries and
    then sees "connection refused", which, unlike a reset, tells it nothing was served. A unix
    listener is shut for reading: a new ``connect()`` is refused at once. Both act on the socket,
    shared by every process holding it: only for listeners we own (a systemd socket outlives us).
    """
    try:
        if sock.family == socket.AF_UNIX:
            sock.shutdown(socket.SHUT_RD)
        else:
            attach_filter(sock, _DROP_SYN)
    except OSError:
        return False
    return True


def attach_filter(sock: socket.socket, program: bytes) -> None:
    """Attach a classic BPF program (struct sock_filter instructions, 8 bytes each) to a socket
    (the kernel copies it: the buffer need not outlive the call)."""
    code = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("@HP", len(program) // 8, ctypes.addressof(code))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)


def tcp_ports(listeners: list[socket.socket]) -> list[Port]:
    """Each TCP listener's (family, port); a dual-stack IPv6 listener's IPv4 handshakes are the
    kernel's AF_INET request sockets: its port is listed under both families."""
    ports: list[Port] = []
    for sock in listeners:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            ports.append((sock.family, sock.getsockname()[1]))
        if sock.family == socket.AF_INET6 and not sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY):
            ports.append((socket.AF_INET, sock.getsockname()[1]))
    return ports


def handshakes_in_flight(ports: list[Port]) -> int:
    """Handshakes on these ports whose SYN was answered and whose last ACK has not arrived (the
    kernel's request sockets, read with sock_diag as ``ss state syn-recv`` does). Once a sealed
    listener has none, nothing can join its queue after the workers' last ``accept()``. 0 when
    the kernel will not say (a process without netlink)."""
    count = 0
    for family in sorted({family for family, _ in ports}):
        try:
            count += sum(1 for port in _syn_recv_ports(family) if (family, port) in ports)
        except OSError:
            pass
    return count


def _syn_recv_ports(family: int) -> list[int]:
    """The local port of each TCP socket of `family` in SYN-RECV (struct inet_diag_req_v2)."""
    request = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, _SYN_RECV) + bytes(48)
    flags = _NLM_F_REQUEST | _NLM_F_DUMP
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, flags, 1, 0)
    ports: list[int] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.send(header + request)
        while True:
            data = nl.recv(1 << 16)
            at = 0
            while at + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, at)
                if kind == _NLMSG_DONE:
                    return ports
                if kind == _NLMSG_ERROR or length < 16:
                    raise OSError("sock_diag refused the request")
                ports.append(struct.unpack_from("!H", data, at + 20)[0])  # inet_diag_msg.id.sport
                at += (length + 3) & ~3
            if not data:
                return ports


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


def _parsed(text: str) -> BindAddress:
    try:
        return parse_bind(text)
    except ValueError:  # config validation parses the same way: only a Config built by hand gets here
        raise ConfigError(f"bind address {text!r} is not a valid address; use {BIND_SYNTAX}") from None


def _bind_one(text: str, backlog: int, reuse_port: bool, ipv4_ports: set[int]) -> socket.socket:
    address = _parsed(text)
    if isinstance(address, FdAddress):
        return _inherited(address.fd, text, backlog)
    family, sockaddr = _resolve(address, text)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if family == socket.AF_INET6:
            v6only = isinstance(address, TcpAddress) and address.port in ipv4_ports
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
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
