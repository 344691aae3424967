"""The PROXY protocol (HAProxy's, v1 text and v2 binary): the client's address at the start of a
connection, sent by a proxy before anything else. Sans-IO: bytes in, a verdict out.

:func:`parse` reads the bytes a connection received so far and says one of:

- :data:`INCOMPLETE`: they are the start of a header; more are needed;
- :data:`NOT_PROXY`: they do not start with a header (the connection is served as it came, as
  gunicorn serves it: the address is the peer's);
- a :class:`ProxyHeader`: its length and the addresses it carries;

or raises :class:`ProxyError` for a malformed header (the connection then gets a 400 and is
closed, as gunicorn answers it). ``mode`` is gunicorn's ``proxy_protocol``: ``v1``, ``v2`` or
``auto`` (either). Because INCOMPLETE means every byte so far belongs to the header, a reader
that must not take a byte past it (a TLS listener, where the handshake follows the header) may
consume all it peeked while the verdict is INCOMPLETE, and exactly up to ``length`` once it is a
header.

A ``LOCAL`` (v2) or ``UNKNOWN`` (v1) header, or one whose addresses are not IP (v2 UNSPEC or
UNIX), carries no client address: the connection keeps its peer's. Which peers may send a header
(``proxy_allow_ips``) is :class:`ProxyPolicy`'s check, made once a header's signature arrived.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from refork.http.forwarded import TrustedProxies

MODES = ("off", "v1", "v2", "auto")
V1_PREFIX = b"PROXY "
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_MAX = 107  # the longest v1 line the specification allows, CRLF included
V2_MAX = 16 + 0xFFFF
PEEK = 536  # what a reader that must not over-read peeks at first (the spec's recommended buffer)


class _Verdict:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


INCOMPLETE = _Verdict("INCOMPLETE")
NOT_PROXY = _Verdict("NOT_PROXY")


class ProxyError(ValueError):
    """A malformed PROXY header: answered `status` 400, then closed."""

    status = 400


class ProxyForbidden(ProxyError):
    """A header from a peer that is not an allowed proxy (``proxy_allow_ips``): 403, then closed."""

    status = 403


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A complete header: `length` bytes, and the client (source) and proxy-side (destination)
    addresses, None when it carries none (LOCAL, UNKNOWN, UNSPEC, UNIX)."""

    length: int
    protocol: str  # "TCP4", "TCP6", "UNKNOWN" (v1); "TCP4", "TCP6", "LOCAL", "UNSPEC", "UNIX" (v2)
    client: tuple[str, int] | None = None
    server: tuple[str, int] | None = None


def parse(data: bytes, mode: str) -> ProxyHeader | _Verdict:
    """The verdict on the first bytes of a connection (see the module docs)."""
    if not data:
        return INCOMPLETE
    if mode in ("v2", "auto") and data[:12] == V2_SIGNATURE[: len(data)]:
        return INCOMPLETE if len(data) < 12 else _v2(data)
    if mode in ("v1", "auto") and data[:6] == V1_PREFIX[: len(data)]:
        return INCOMPLETE if len(data) < 6 else _v1(data)
    return NOT_PROXY


def _v1(data: bytes) -> ProxyHeader | _Verdict:
    end = data.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(data) >= V1_MAX or b"\n" in data[:V1_MAX]:
            raise ProxyError("PROXY v1 line longer than 107 bytes or without CRLF")
        return INCOMPLETE
    line = data[:end]
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ProxyError("PROXY v1 line is not ASCII") from None
    parts = text.split(" ")
    if len(parts) >= 2 and parts[1] == "UNKNOWN":  # the proxy does not know: the peer's address stays
        return ProxyHeader(end + 2, "UNKNOWN")
    if len(parts) != 6:
        raise ProxyError(f"invalid PROXY v1 line {text!r}")
    _, proto, src, dst, sport, dport = parts
    if proto not in ("TCP4", "TCP6"):
        raise ProxyError(f"PROXY v1 protocol {proto!r} not supported")
    version = 4 if proto == "TCP4" else 6
    client = (_address(src, version), _port(sport))
    server = (_address(dst, version), _port(dport))
    return ProxyHeader(end + 2, proto, client, server)


def _address(text: str, version: int) -> str:
    """The address as sent (gunicorn's), checked as inet_pton checks it."""
    try:
        socket.inet_pton(socket.AF_INET if version == 4 else socket.AF_INET6, text)
    except OSError:
        raise ProxyError(f"invalid PROXY v1 address {text!r} for TCP{version}") from None
    return text


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 5 and int(text) <= 65535):
        raise ProxyError(f"invalid PROXY v1 port {text!r}")
    return int(text)


def _v2(data: bytes) -> ProxyHeader | _Verdict:
    if len(data) < 16:
        return INCOMPLETE
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyError(f"PROXY v2 version {version} not supported")
    if command > 1:
        raise ProxyError(f"PROXY v2 command {command} not supported")
    (size,) = struct.unpack_from(">H", data, 14)
    total = 16 + size
    if len(data) < total:
        return INCOMPLETE
    if command == 0:  # LOCAL: the proxy's own connection (a health check): the peer's address stays
        return ProxyHeader(total, "LOCAL")
    family, transport = data[13] >> 4, data[13] & 0x0F
    if family == 0:
        return ProxyHeader(total, "UNSPEC")
    if transport != 1:
        raise ProxyError(f"PROXY v2 transport {transport} not supported (TCP only)")
    body = data[16:total]
    if family == 1:
        if size < 12:
            raise ProxyError("PROXY v2 header too short for IPv4 addresses")
        src, dst = ipaddress.IPv4Address(body[0:4]), ipaddress.IPv4Address(body[4:8])
        sport, dport = struct.unpack_from(">HH", body, 8)
        return ProxyHeader(total, "TCP4", (str(src), sport), (str(dst), dport))
    if family == 2:
        if size < 36:
            raise ProxyError("PROXY v2 header too short for IPv6 addresses")
        src6, dst6 = ipaddress.IPv6Address(body[0:16]), ipaddress.IPv6Address(body[16:32])
        sport, dport = struct.unpack_from(">HH", body, 32)
        return ProxyHeader(total, "TCP6", (str(src6), sport), (str(dst6), dport))
    if family == 3:  # AF_UNIX: no IP address to tell
        return ProxyHeader(total, "UNIX")
    raise ProxyError(f"PROXY v2 address family {family} not supported")


class ProxyPolicy:
    """``proxy_protocol`` and ``proxy_allow_ips``: which peers may send a header, and the verdict on
    a connection's first bytes. A unix-socket peer may always send one (gunicorn's rule)."""

    def __init__(self, mode: str, allow: Iterable[str]) -> None:
        self.mode = mode
        self.allow = list(allow)
        self.proxies = TrustedProxies(entry for entry in self.allow if entry != "unix:")

    def allowed(self, peer: str | None) -> bool:
        return peer is None or self.proxies.trusts(peer)

    def check(self, data: bytes, peer: str | None) -> ProxyHeader | _Verdict:
        """parse(), and ProxyForbidden once a header's signature has arrived from a peer that may not
        send one (before its syntax is judged, as gunicorn does)."""
        try:
            verdict = parse(data, self.mode)
        except ProxyError as e:
            error: ProxyError | None = e
            verdict = INCOMPLETE
        else:
            error = None
        signed = (self.mode != "v2" and data.startswith(V1_PREFIX)) or (
            self.mode != "v1" and data.startswith(V2_SIGNATURE)
        )
        if signed and not self.allowed(peer):
            raise ProxyForbidden("a PROXY header from a peer not in proxy_allow_ips")
        if error is not None:
            raise error
        return verdict


def policy(mode: str, allow: Iterable[str]) -> ProxyPolicy | None:
    """The policy of the settings; None when ``proxy_protocol`` is off."""
    return None if mode == "off" else ProxyPolicy(mode, allow)


__all__ = [
    "INCOMPLETE", "MODES", "NOT_PROXY", "PEEK", "V1_PREFIX", "V2_SIGNATURE", "ProxyError", "ProxyForbidden",
    "ProxyHeader", "ProxyPolicy", "parse", "policy",
]  # fmt: skip
