"""Trust X-Forwarded-Proto / X-Forwarded-For only from configured proxy addresses."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_proxy(text: str) -> str | Network:
    """One trusted-proxy entry: "*", a host address (kept as text) or a network (it has a "/").

    ValueError for a network that does not parse; config validation calls this too, so the
    setting is checked by the same code that later applies it.
    """
    return ipaddress.ip_network(text, strict=False) if "/" in text else text


class TrustedProxies:
    """Which peers may tell us the client's scheme and address ("*" trusts everyone)."""

    def __init__(self, allow: Iterable[str]) -> None:
        self.any = False
        self.hosts: set[str] = set()
        self.networks: list[Network] = []
        for item in allow:
            item = item.strip()
            if not item:
                continue
            entry = parse_proxy(item)
            if entry == "*":
                self.any = True
            elif isinstance(entry, str):
                self.hosts.add(entry)
            else:
                self.networks.append(entry)

    def trusts(self, host: str | None) -> bool:
        if self.any:
            return True
        if host is None:
            return False
        if host in self.hosts:
            return True
        if self.networks:
            try:
                ip = ipaddress.ip_address(host)
            except ValueError:
                return False
            return any(ip in net for net in self.networks)
        return False


def resolve_forwarded(
    headers: list[tuple[bytes, bytes]], peer_host: str | None, scheme: str, proxies: TrustedProxies
) -> tuple[str, str | None]:
    """Return (scheme, client_host) after applying trusted X-Forwarded-* headers.

    The client is the right-most X-Forwarded-For entry that is not itself a trusted proxy.
    """
    if not proxies.trusts(peer_host):
        return scheme, peer_host
    proto = None
    forwarded_for = None
    for name, value in headers:
        if name == b"x-forwarded-proto":
            proto = value.decode("latin-1").split(",")[-1].strip().lower()
        elif name == b"x-forwarded-for":
            forwarded_for = value.decode("latin-1")
    if proto in ("http", "https", "ws", "wss"):
        scheme = proto
    client = peer_host
    if forwarded_for:
        hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
        for hop in reversed(hops):
            client = hop
            if not proxies.trusts(hop):
                break
    return scheme, client
