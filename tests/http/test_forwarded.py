"""X-Forwarded-* is believed only from the peers --forwarded-allow-ips names, in WSGI and ASGI alike.

Unit tests of the one rule (refork.http.forwarded), then real servers over TCP and a unix socket.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket

import pytest
from support.h2client import H2Client
from support.request_paths import OVER_TLS, flags, http2, wsgi_paths

from refork.config import load_config
from refork.config.load import ANY_CLIENT
from refork.errors import ConfigError
from refork.http.forwarded import TrustedProxies, parse_address, parse_proxy, resolve_forwarded

# ---------------------------------------------------------------------------------------------
# Unit: which peers are trusted


def test_unix_peers_are_trusted_only_when_listed():
    assert not TrustedProxies(["127.0.0.1", "::1"]).trusts(None)  # the default: loopback only
    assert TrustedProxies(["unix:"]).trusts(None)
    assert not TrustedProxies(["unix:"]).trusts("127.0.0.1")
    assert TrustedProxies(["*"]).trusts(None) and TrustedProxies(["*"]).trusts("192.0.2.1")


def test_addresses_are_compared_as_addresses():
    proxies = TrustedProxies(["::1", "10.0.0.0/8", "192.0.2.7"])
    assert proxies.trusts("0:0:0:0:0:0:0:1")  # another spelling of ::1
    assert proxies.trusts("::ffff:10.1.2.3")  # an IPv4 peer of a dual-stack listener
    assert proxies.trusts("192.0.2.7") and not proxies.trusts("192.0.2.8")
    assert not proxies.trusts("localhost") and not proxies.trusts("")


@pytest.mark.parametrize("entry", ["localhost", "unix", "10.0.0.0/99", "1.2.3"])
def test_entries_that_could_never_match_are_refused(entry):
    with pytest.raises(ValueError):
        parse_proxy(entry)
    with pytest.raises(ConfigError):
        load_config(["--forwarded-allow-ips", f"127.0.0.1,{entry}", "m:app"], environ={})


def test_config_accepts_unix_and_star():
    config = load_config(["--forwarded-allow-ips", "unix:, 10.0.0.0/8", "m:app"], environ={})
    assert config.forwarded_allow_ips == ["unix:", "10.0.0.0/8"]
    assert TrustedProxies(config.forwarded_allow_ips).trusts(None)


@pytest.mark.parametrize(
    ("args", "client"),
    [
        ([], "auto"),  # refork's default trust (loopback, unix:): the client their X-Forwarded-For names
        (["--forwarded-allow-ips", "*"], "off"),  # gunicorn's setting keeps gunicorn's meaning
        (["-k", "uvicorn.workers.UvicornWorker", "--forwarded-allow-ips", "*"], "on"),  # uvicorn's worker's
        (["-k", "uvicorn_worker.UvicornH11Worker", "--forwarded-allow-ips", "10.0.0.1"], "on"),
        (["--forwarded-allow-ips", "*", "--forwarded-client", "on"], "on"),
        (["--forwarded-client", "off"], "off"),
    ],
)
def test_forwarded_client_auto_follows_the_server_the_settings_were_written_for(args, client):
    assert load_config([*args, "m:app"], environ={}).forwarded_client == client


def test_forwarded_allow_ips_from_the_environment_keeps_gunicorns_meaning():
    config = load_config(["m:app"], environ={"FORWARDED_ALLOW_IPS": "*"})
    assert config.forwarded_client == "off"
    assert any("REMOTE_ADDR stays the proxy's address" in line for _, line in config.notes)


def test_trusting_every_hop_for_the_client_is_said_at_start():
    config = load_config(["--forwarded-allow-ips", "*", "--forwarded-client", "on", "m:app"], environ={})
    assert [line for level, line in config.notes if "chooses its own REMOTE_ADDR" in line] == [
        "--forwarded-allow-ips: " + ANY_CLIENT
    ]
    everyone = ["--forwarded-allow-ips", "0.0.0.0/0", "--forwarded-client", "on", "m:app"]
    assert any("chooses its own REMOTE_ADDR" in line for _, line in load_config(everyone, environ={}).notes)
    named = ["--forwarded-allow-ips", "10.0.0.0/8", "--forwarded-client", "on", "m:app"]
    quiet = load_config(named, environ={})
    assert quiet.notes == []


# ---------------------------------------------------------------------------------------------
# Unit: what X-Forwarded-For may say


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("203.0.113.7", "203.0.113.7"),
        (" 203.0.113.7 ", "203.0.113.7"),
        ("203.0.113.7:4711", "203.0.113.7"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("[2001:db8::1]:4711", "2001:db8::1"),
        ("2001:DB8:0::1", "2001:db8::1"),
    ],
)
def test_parse_address_de_facto_spellings(text, address):
    assert parse_address(text) == ipaddress.ip_address(address)


@pytest.mark.parametrize(
    "text",
    ["unknown", "_hidden", "example.com", "1.2.3", "01.2.3.4", "1.2.3.4:", "1.2.3.4:x", "[::1", "[::1]x",
     "[::1]:", "[::1]:８０", "", "\x1b[31m", "1.2.3.4 5.6.7.8", "<script>"],
)  # fmt: skip
def test_parse_address_refuses_what_is_not_an_address(text):
    assert parse_address(text) is None


def _xff(value: str, proto: str = "https") -> list[tuple[bytes, bytes]]:
    return [(b"x-forwarded-for", value.encode("latin-1")), (b"x-forwarded-proto", proto.encode())]


LOOPBACK = TrustedProxies(["127.0.0.1", "10.0.0.0/8"])


@pytest.mark.parametrize(
    ("xff", "client"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("198.51.100.1, 203.0.113.7, 10.0.0.2", "203.0.113.7"),  # right-most untrusted hop
        ("10.0.0.3, 10.0.0.2", "10.0.0.3"),  # every hop a proxy: the left-most
        ("[2001:db8::1]:4711", "2001:db8::1"),
        ("203.0.113.7:4711", "203.0.113.7"),
        ("garbage, 203.0.113.7", "203.0.113.7"),  # left of the client: never looked at
        ("203.0.113.7, garbage", "127.0.0.1"),  # the chain breaks: the peer is kept
        ("unknown", "127.0.0.1"),
        ("evil\x1b[2J", "127.0.0.1"),
        (" , ", "127.0.0.1"),
    ],
)
def test_resolve_forwarded_client(xff, client):
    assert resolve_forwarded(_xff(xff), "127.0.0.1", "http", LOOPBACK) == ("https", client)


def test_resolve_forwarded_untrusted_peer_changes_nothing():
    assert resolve_forwarded(_xff("203.0.113.7"), "192.0.2.1", "http", LOOPBACK) == ("http", "192.0.2.1")
    assert resolve_forwarded(_xff("203.0.113.7"), None, "http", LOOPBACK) == ("http", None)
    assert resolve_forwarded(_xff("203.0.113.7"), None, "http", TrustedProxies(["unix:"])) == (
        "https",
        "203.0.113.7",
    )


def test_without_client_a_trusted_proxy_sets_the_scheme_only():
    """gunicorn's meaning of forwarded_allow_ips (--forwarded-client off): X-Forwarded-For is not read."""
    scheme_only = TrustedProxies(["*"], client=False)
    assert resolve_forwarded(_xff("198.51.100.1, 203.0.113.9"), "127.0.0.1", "http", scheme_only) == (
        "https",
        "127.0.0.1",
    )
    assert resolve_forwarded(_xff("203.0.113.7"), None, "http", scheme_only) == ("https", None)


@pytest.mark.parametrize(
    ("xff", "client"),
    [
        ("198.51.100.1, 203.0.113.9", "203.0.113.9"),  # what the client wrote is left of the proxy's entry
        ("198.51.100.1, 203.0.113.9, 10.0.0.2", "203.0.113.9"),  # trusted hops skipped, right to left
    ],
)
def test_a_spoofed_forwarded_for_names_the_right_most_untrusted_entry(xff, client):
    assert resolve_forwarded(_xff(xff), "127.0.0.1", "http", LOOPBACK) == ("https", client)
    every_hop = TrustedProxies(["*"])
    assert resolve_forwarded(_xff(xff), "127.0.0.1", "http", every_hop) == ("https", "198.51.100.1")


def test_repeated_forwarded_for_lines_are_one_list():
    headers = [(b"x-forwarded-for", b"203.0.113.7"), (b"x-forwarded-for", b"10.0.0.2")]
    assert resolve_forwarded(headers, "127.0.0.1", "http", LOOPBACK) == ("http", "203.0.113.7")


def test_remembered_verdicts_are_the_same_verdicts():
    """TrustedProxies remembers its answers per peer and per X-Forwarded-For list (an address costs
    microseconds to parse); a full table is emptied, never wrong."""
    proxies = TrustedProxies(["10.0.0.0/8"])
    proxies.MEMO = 8
    for _ in range(3):
        for i in range(20):
            xff = f"203.0.113.{i}, 10.0.0.{i}"
            assert proxies.client_from(xff) == f"203.0.113.{i}"
            assert proxies.trusts(f"10.1.2.{i}") and not proxies.trusts(f"192.0.2.{i}")
        assert proxies.client_from("junk, 10.0.0.1") is None
        assert len(proxies._clients) <= 8 and len(proxies._trusted) <= 8


# ---------------------------------------------------------------------------------------------
# Real servers: TCP and unix-socket peers, WSGI and ASGI


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def _ask(
    server, unix: str | None, xff: str, headers: dict[str, str] | None = None
) -> tuple[str, str | None]:
    """(scheme, client address) as the app saw them (by default behind X-Forwarded-Proto: https)."""
    wsgi = server.interface == "wsgi"
    conn: http.client.HTTPConnection = (
        _UnixHTTPConnection(unix)
        if unix
        else http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    )
    try:
        proto = headers if headers is not None else {"X-Forwarded-Proto": "https"}
        headers = {"X-Forwarded-For": xff, **proto}
        conn.request("GET", "/environ" if wsgi else "/scope", headers=headers)
        response = conn.getresponse()
        assert response.status == 200
        seen = json.loads(response.read())
    finally:
        conn.close()
    if wsgi:  # a unix peer's REMOTE_ADDR is '' (gunicorn's), its ASGI client None: no address either way
        return seen["wsgi.url_scheme"], seen["REMOTE_ADDR"] or None
    return seen["scheme"], seen["client"][0] if seen["client"] else None


APPS = {"wsgi": "apps.wsgi_apps:app", "asgi": "apps.asgi_apps:app"}


@pytest.fixture(params=["wsgi", "wsgi-threads", "asgi"])
def serve(request, start_server, tmp_path):
    interface = request.param.partition("-")[0]
    threads = ["--threads", "4"] if request.param.endswith("threads") else []  # (the pool engine)

    def start(*allow: str, extra: tuple[str, ...] = ()):
        unix = str(tmp_path / f"{request.param}-{len(allow)}.sock")
        args = ["-b", f"unix:{unix}", *threads, *extra]
        if allow:  # (these tests are about whom the client's address is taken from)
            args += ["--forwarded-allow-ips", ",".join(allow), "--forwarded-client", "on"]
        server = start_server(*args, app=APPS[interface], workers=1)
        server.interface = interface
        return server, unix

    return start


def test_default_trusts_local_peers_loopback_tcp_and_unix(serve):
    server, unix = serve()
    assert _ask(server, None, "203.0.113.7") == ("https", "203.0.113.7")
    assert _ask(server, unix, "203.0.113.7") == ("https", "203.0.113.7")


def test_a_list_without_unix_distrusts_unix_peers(serve):
    server, unix = serve("127.0.0.1")
    assert _ask(server, None, "203.0.113.7") == ("https", "203.0.113.7")
    assert _ask(server, unix, "203.0.113.7") == ("http", None)


def test_unix_entry_trusts_unix_peers_only(serve):
    server, unix = serve("unix:")
    assert _ask(server, unix, "203.0.113.7") == ("https", "203.0.113.7")
    assert _ask(server, unix, "[2001:db8::1]:4711") == ("https", "2001:db8::1")
    assert _ask(server, None, "203.0.113.7") == ("http", "127.0.0.1")


def test_forwarded_for_that_is_not_an_address_is_ignored(serve):
    server, unix = serve("127.0.0.1", "unix:")
    for junk in ("unknown", "not-an-ip", "203.0.113.7, <script>", "1.2.3.4.5"):
        assert _ask(server, None, junk) == ("https", "127.0.0.1"), junk
        assert _ask(server, unix, junk) == ("https", None), junk
    assert _ask(server, None, "203.0.113.7:4711") == ("https", "203.0.113.7")


def _scheme(server, headers: dict[str, str]) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/environ" if server.interface == "wsgi" else "/scope", headers=headers)
        seen = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return seen["wsgi.url_scheme"] if server.interface == "wsgi" else seen["scheme"]


def test_gunicorn_secure_scheme_headers_by_default(serve):
    """gunicorn's default: X-Forwarded-Proto https, X-Forwarded-Ssl on, X-Forwarded-Protocol ssl."""
    server, _ = serve()
    assert _scheme(server, {"X-Forwarded-Ssl": "on"}) == "https"
    assert _scheme(server, {"X-Forwarded-Protocol": "ssl"}) == "https"
    assert _scheme(server, {"X-Forwarded-Ssl": "off"}) == "http"
    assert _scheme(server, {}) == "http"


def test_secure_scheme_headers_replace_the_default(serve, tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("secure_scheme_headers = {'X-FORWARDED-SCHEME': 'https'}\n")
    server, _ = serve(extra=("-c", str(conf)))
    assert _scheme(server, {"X-Forwarded-Scheme": "https"}) == "https"
    assert _scheme(server, {"X-Forwarded-Proto": "https"}) == "http"  # no longer a secure header
    assert _scheme(server, {"X-Forwarded-Ssl": "on"}) == "http"


def test_a_secure_scheme_header_of_any_name_says_https(serve):
    """gunicorn's secure_scheme_headers may name any field (here X-Scheme): a trusted proxy's
    says https on every path, the native engines' included."""
    server, _ = serve("127.0.0.1", extra=("--secure-scheme-header", "X-SCHEME=https"))
    assert _ask(server, None, "203.0.113.7", {"X-Scheme": "https"}) == ("https", "203.0.113.7")
    assert _ask(server, None, "203.0.113.7", {"X-Scheme": "http"})[0] == "http"
    assert _ask(server, None, "203.0.113.7", {"X-Forwarded-Proto": "https"})[0] == "http"  # not named


@wsgi_paths
def test_a_unix_peer_without_forwarded_for_has_an_empty_remote_addr(start_server, tmp_path, path):
    """gunicorn's REMOTE_ADDR for a unix-socket peer is '' (no REMOTE_PORT): an app reading
    environ["REMOTE_ADDR"] must not get a KeyError."""
    unix = tmp_path / "app.sock"
    chosen, app = flags(path, "apps.access_apps")
    start_server("-b", f"unix:{unix}", *chosen, app=app, workers=1)
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(str(unix))
    if http2(path) and path not in OVER_TLS:  # (a unix listener is never TLS: HTTP/1.1 there)
        client = H2Client(0, sock=sock)
        try:
            status, body = client.request("GET", "/peer")
        finally:
            client.close()
    else:
        with sock:
            sock.sendall(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            response = b""
            while chunk := sock.recv(4096):
                response += chunk
        status, body = int(response.split()[1]), response.split(b"\r\n\r\n", 1)[1]
    assert (status, body) == (200, b" None http")  # REMOTE_ADDR '', REMOTE_PORT absent
