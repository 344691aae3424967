"""Bind addresses and trusted proxies: one parser each, for config validation and for applying them."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from refork.addresses import FdAddress, TcpAddress, UnixAddress, parse_bind
from refork.config import ConfigError, load_config
from refork.http.forwarded import TrustedProxies, parse_proxy
from refork.process import listeners


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8000", TcpAddress("127.0.0.1", 8000, ipv6=False)),
        ("localhost:80", TcpAddress("localhost", 80, ipv6=False)),
        (":9000", TcpAddress("0.0.0.0", 9000, ipv6=False)),
        ("[::1]:9001", TcpAddress("::1", 9001, ipv6=True)),
        ("[fe80::1%eth0]:1", TcpAddress("fe80::1%eth0", 1, ipv6=True)),
        ("unix:/run/a.sock", UnixAddress("/run/a.sock")),
        ("fd://3", FdAddress(3)),
    ],
)
def test_parse_bind(text, expected):
    assert parse_bind(text) == expected
    assert load_config(["-b", text, "m:app"], environ={}).bind == [text]


@pytest.mark.parametrize(
    "text", ["unix:/run/a.sock", "unix:run/a.sock", "unix://tmp/a.sock", "unix:///tmp/a.sock"]
)
def test_a_unix_path_is_the_one_gunicorn_binds(text):
    from gunicorn.util import parse_address

    assert parse_bind(text) == UnixAddress(parse_address(text))


@pytest.mark.parametrize(
    "text",
    ["localhost", "1.2.3.4:99999", "fd://x", "fd://", "unix:", "unix://", "::1:80", "[::1]", "host:port"],
)
def test_parse_bind_rejects(text):
    with pytest.raises(ValueError, match="use HOST:PORT, \\[V6\\]:PORT, :PORT, unix:PATH or fd://N"):
        parse_bind(text)
    if text in ("localhost", "[::1]"):  # gunicorn's host alone: port 8000
        assert load_config(["-b", text, "m:app"], environ={}).bind == [f"{text}:8000"]
        return
    with pytest.raises(ConfigError, match="is not a valid address; use HOST:PORT"):
        load_config(["-b", text, "m:app"], environ={})


def test_listeners_bind_what_config_accepts(tmp_path):
    inherited = socket.socket()
    inherited.bind(("127.0.0.1", 0))
    path = str(tmp_path / "s.sock")
    socks = listeners.bind(["127.0.0.1:0", f"unix:{path}", f"fd://{inherited.fileno()}"], 16)
    try:
        assert [s.family for s in socks] == [socket.AF_INET, socket.AF_UNIX, socket.AF_INET]
        assert listeners.describe(socks[1]) == f"unix:{path}"
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) for s in socks)
    finally:
        for s in socks:
            s.close()


def test_an_ipv6_wildcard_beside_ipv4_on_its_port_is_ipv6_only():
    """[::]:P alone is dual-stack; with 0.0.0.0:P too it must be IPv6-only, or the binds collide."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    socks = listeners.bind([f"0.0.0.0:{port}", f"[::]:{port}", "[::]:0"], 16)
    try:
        v6only = [s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) for s in socks[1:]]
        assert v6only == [1, 0]
        assert (socket.AF_INET, socks[2].getsockname()[1]) in listeners.tcp_ports(socks)
    finally:
        for s in socks:
            s.close()


def test_listeners_reject_an_unchecked_address():
    with pytest.raises(ConfigError, match="bind address 'localhost' is not a valid address"):
        listeners.bind(["localhost"], 16)


def test_parse_proxy():
    assert parse_proxy("*") == "*"
    assert parse_proxy("10.0.0.1") == "10.0.0.1"
    assert parse_proxy("10.0.0.0/8") == ipaddress.ip_network("10.0.0.0/8")
    assert parse_proxy("10.1.2.3/8") == ipaddress.ip_network("10.0.0.0/8")  # host bits allowed
    with pytest.raises(ValueError):
        parse_proxy("10.0.0.0/99")


def test_trusted_proxies_apply_what_config_accepts():
    allow = load_config(["--forwarded-allow-ips", "127.0.0.1, 10.0.0.0/8,,", "m:app"], environ={})
    proxies = TrustedProxies(allow.forwarded_allow_ips)
    assert proxies.trusts("127.0.0.1") and proxies.trusts("10.9.8.7")
    assert not proxies.trusts("192.0.2.1") and not proxies.trusts(None) and not proxies.trusts("name")
    assert TrustedProxies(["*"]).trusts("192.0.2.1")
