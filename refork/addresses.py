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
    """HOST:PORT, [V6]:PORT, :PORT, unix:PATH or fd://N -> its typed form; ValueError otherwise."""
    if text.startswith("unix:") and len(text) > 5:
        return UnixAddress(text[5:])
    if text.startswith("fd://") and text[5:].isdecimal():
        return FdAddress(int(text[5:]))
    m = _HOST_PORT_RE.match(text)
    if m and int(m.group(2)) <= 65535:
        host, port = m.group(1), int(m.group(2))
        if host.startswith("["):
            return TcpAddress(host[1:-1], port, ipv6=True)
        return TcpAddress(host or "0.0.0.0", port, ipv6=False)
    raise ValueError(f"{text!r} is not a valid address; use {BIND_SYNTAX}")


__all__ = ["BIND_SYNTAX", "BindAddress", "FdAddress", "TcpAddress", "UnixAddress", "parse_bind"]
