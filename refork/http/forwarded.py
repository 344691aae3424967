"""Trust X-Forwarded-Proto / X-Forwarded-For only from configured proxies.

One rule for both interfaces: :meth:`TrustedProxies.trusts` decides about the peer (an IP
address, or ``None`` for a unix-socket peer) and about every hop of X-Forwarded-For. Whether
X-Forwarded-For names the client at all is :attr:`TrustedProxies.client` (``--forwarded-client``):
gunicorn takes only the scheme from a trusted proxy, uvicorn the client too.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

SECURE_SCHEME_HEADERS = {"X-FORWARDED-PROTOCOL": "ssl", "X-FORWARDED-PROTO": "https", "X-FORWARDED-SSL": "on"}
"""gunicorn's default secure_scheme_headers."""

UNIX = "unix:"
"""The entry that trusts unix-socket peers (nginx's ``set_real_ip_from unix:`` spelling)."""


def parse_proxy(text: str) -> str | Network:
    """One trusted-proxy entry: ``*``, ``unix:``, an address (kept as text) or a network (a "/").

    ValueError for anything else: config validation calls this too, so a setting is checked by
    the same code that later applies it (a host name would never match a peer address, so it is
    refused rather than silently ignored).
    """
    if "/" in text:
        return ipaddress.ip_network(text, strict=False)
    if text not in ("*", UNIX):
        ipaddress.ip_address(text)
    return text


def parse_address(text: str) -> Address | None:
    """An X-Forwarded-For entry as an IP address, or None when it is not one.

    The de-facto spellings: ``192.0.2.1``, ``192.0.2.1:4711``, ``2001:db8::1``,
    ``[2001:db8::1]`` and ``[2001:db8::1]:4711``; the port is dropped. ``unknown``, a host name,
    an obfuscated identifier (RFC 7239 ``_hidden``) or garbage are not addresses.
    """
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1 :] if end > 0 else "x"
        if rest and not (rest[0] == ":" and _is_port(rest[1:])):
            return None
        text = text[1:end]
    elif text.count(":") == 1:  # IPv4 with a port; an IPv6 address has two colons or more
        text, _, port = text.partition(":")
        if not _is_port(port):
            return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _unmapped(ip: Address) -> Address:
    """::ffff:192.0.2.1 (an IPv4 peer of a dual-stack socket) is 192.0.2.1 for trust."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class TrustedProxies:
    """Which peers may tell us the client's scheme and address.

    ``*`` trusts every peer, unix-socket peers included; ``unix:`` trusts unix-socket peers;
    addresses and networks trust TCP peers (and X-Forwarded-For hops) inside them. `client`:
    whether their X-Forwarded-For replaces the peer's address (False: the scheme only).
    """

    MEMO = 4096  # remembered verdicts per table (emptied when full): proxies are few, clients repeat

    def __init__(self, allow: Iterable[str], secure_headers: Mapping[str, str] | None = None,
                 client: bool = True) -> None:  # fmt: skip
        self.client = client
        # gunicorn's secure_scheme_headers: a trusted proxy's header that says https (names
        # case-insensitive, values exact); X-Forwarded-Proto may also say http, ws or wss
        headers = SECURE_SCHEME_HEADERS if secure_headers is None else secure_headers
        self.secure_headers = {name.lower().encode("latin-1"): value for name, value in headers.items()}
        # parsing an address with ipaddress costs microseconds; a request behind a proxy asks the
        # same questions as the last one from that proxy and that client
        self._trusted: dict[str, bool] = {}
        self._clients: dict[str, str | None] = {}
        self.any = False
        self.unix = False
        self.addresses: set[Address] = set()
        self.networks: list[Network] = []
        for item in allow:
            item = item.strip()
            if not item:
                continue
            entry = parse_proxy(item)
            if entry == "*":
                self.any = True
            elif entry == UNIX:
                self.unix = True
            elif isinstance(entry, str):
                self.addresses.add(_unmapped(ipaddress.ip_address(entry)))
            else:
                self.networks.append(entry)

    def trusts(self, host: str | None) -> bool:
        """Whether `host` (an address as text; None for a unix-socket peer) is a trusted proxy."""
        if self.any:
            return True
        if host is None:
            return self.unix
        hit = self._trusted.get(host)
        if hit is None:
            ip = parse_address(host)
            hit = ip is not None and self.trusts_address(ip)
            if len(self._trusted) >= self.MEMO:
                self._trusted.clear()
            self._trusted[host] = hit
        return hit

    def client_from(self, forwarded_for: str) -> str | None:
        """The client an X-Forwarded-For list names, as a normalised address; None when it names
        none (see resolve_forwarded)."""
        try:
            return self._clients[forwarded_for]
        except KeyError:
            pass
        client = _client_from(forwarded_for, self)
        if len(self._clients) >= self.MEMO:
            self._clients.clear()
        self._clients[forwarded_for] = client
        return client

    def trusts_address(self, ip: Address) -> bool:
        if self.any:
            return True
        ip = _unmapped(ip)
        return ip in self.addresses or any(ip in net for net in self.networks)


def resolve_forwarded(
    headers: list[tuple[bytes, bytes]], peer_host: str | None, scheme: str, proxies: TrustedProxies
) -> tuple[str, str | None]:
    """Return (scheme, client_host) after applying trusted X-Forwarded-* headers.

    `peer_host` is None for a unix-socket peer. The client (when ``proxies.client``) is the
    right-most X-Forwarded-For entry that is not itself a trusted proxy (the left-most when all
    are). An entry that is not an IP address breaks the chain: nobody trusted vouches for what lies
    left of it, so the peer address is kept.
    """
    if not proxies.trusts(peer_host):
        return scheme, peer_host
    return forwarded_by_trusted(headers, peer_host, scheme, proxies)


def forwarded_by_trusted(
    headers: list[tuple[bytes, bytes]], peer_host: str | None, scheme: str, proxies: TrustedProxies
) -> tuple[str, str | None]:
    """resolve_forwarded() for a peer already known to be a trusted proxy (a connection checks
    its peer once, not at every request)."""
    proto = None
    secure: bool | None = None  # what the other secure_scheme_headers say
    forwarded_for: list[str] = []  # repeated lines are one comma-separated list
    expected = proxies.secure_headers
    for_client = proxies.client
    for name, value in headers:
        if name == b"x-forwarded-for" and for_client:
            forwarded_for.append(value.decode("latin-1"))
        elif name in expected:
            text = value.decode("latin-1").split(",")[-1].strip()
            if name == b"x-forwarded-proto" and expected[name] == "https":
                proto = text.lower()
            else:
                secure = secure or text == expected[name]
    if proto in ("http", "https", "ws", "wss"):
        scheme = proto
    elif secure is not None:
        scheme = "https" if secure else "http"
    client = proxies.client_from(",".join(forwarded_for)) if forwarded_for else None
    return scheme, client or peer_host


def _client_from(forwarded_for: str, proxies: TrustedProxies) -> str | None:
    """The client X-Forwarded-For names, as a normalised address; None when it names none."""
    client = None
    for hop in reversed(forwarded_for.split(",")):
        if not hop.strip():
            continue
        ip = parse_address(hop)
        if ip is None:
            return None
        client = str(ip)
        if not proxies.trusts_address(ip):
            break
    return client
