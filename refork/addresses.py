"""Bind addresses, parsed once: config validation and the monitor's binding read the same types.

A leaf module (it imports nothing of refork) so that both refork.config and refork.process can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

BIND_SYNTAX = "HOST:PORT, [V6]:PORT, :PORT, unix:PATH or fd://N"
"""What a valid address looks like, for error messages."""

_HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.%\w]+\]|[\w.\-]*):(\d{1,5})$")


@dataclass(frozen=True)
class TcpAddress:
    """HOST:PORT (a name or an IPv4 address; empty = all interfaces) or [V6]:PORT."""

    host: str
    port: int
    ipv6: bool


@dataclass(frozen=True)
class UnixAddress:
    path: str


@dataclass(frozen=True)
class FdAddress:
    """A socket inherited from whoever started us (systemd, a supervisor), by descriptor number."""

    fd: int


BindAddress = TcpAddress | UnixAddress | FdAddress


def parse_bind(text: str) -> BindAddress:
    """HOST:PORT, [V6]:PORT, :PORT, unix:PATH or fd://N -> its typed form; ValueError otherwise.
    ``unix://PATH`` is ``unix:PATH`` as gunicorn reads it: ``unix://tmp/a.sock`` is the relative
    ``tmp/a.sock``, ``unix:///tmp/a.sock`` the absolute one."""
    if text.startswith("unix:"):
        path = text[7:] if text.startswith("unix://") else text[5:]
        if path:
            return UnixAddress(path)
    if text.startswith("fd://") and text[5:].isdecimal():
        return FdAddress(int(text[5:]))
    m = _HOST_PORT_RE.match(text)
    if m and int(m.group(2)) <= 65535:
        host, port = m.group(1), int(m.group(2))
        if host.startswith("["):
            return TcpAddress(host[1:-1], port, ipv6=True)
        return TcpAddress(host or "0.0.0.0", port, ipv6=False)
    raise ValueError(f"{text!r} is not a valid address; use {BIND_SYNTAX}")


def gunicorn_address(text: str) -> tuple[str, int] | str | int:
    """A bind address as gunicorn's ``server.address`` lists it (its util.parse_address): (host,
    port) for TCP (the host lower-cased, '' for :PORT), the path for unix, the number for fd://N."""
    address = parse_bind(text)
    if isinstance(address, UnixAddress):
        return address.path
    if isinstance(address, FdAddress):
        return address.fd
    return ("" if text.startswith(":") else address.host.lower(), address.port)


STATSD_SYNTAX = "HOST:PORT, HOST (port 8125), [V6]:PORT or unix:PATH"


def parse_statsd(text: str) -> TcpAddress | UnixAddress:
    """A StatsD server's address, as gunicorn reads ``statsd_host``: HOST:PORT, HOST alone (port
    8125), [V6]:PORT, unix:PATH or unix://PATH (a datagram socket); ValueError otherwise.
    (``unix:8125`` is the host "unix" on port 8125, as in gunicorn.)"""
    text = text.strip()
    if text.startswith("unix:") and not text[5:].isdecimal():
        path = text[7:] if text.startswith("unix://") else text[5:]
        if path:
            return UnixAddress(path)
    elif text:
        if ":" not in text or (text.startswith("[") and text.endswith("]")):
            text += ":8125"
        m = _HOST_PORT_RE.match(text)
        if m and m.group(1) and int(m.group(2)) <= 65535:
            host = m.group(1)
            if host.startswith("["):
                return TcpAddress(host[1:-1], int(m.group(2)), ipv6=True)
            return TcpAddress(host, int(m.group(2)), ipv6=False)
    raise ValueError(f"{text!r} is not a StatsD address; use {STATSD_SYNTAX}")


__all__ = [
    "BIND_SYNTAX", "STATSD_SYNTAX", "BindAddress", "FdAddress", "TcpAddress", "UnixAddress",
    "gunicorn_address", "parse_bind", "parse_statsd",
]  # fmt: skip
