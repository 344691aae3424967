"""X-Forwarded-For/-Proto with spoofed entries, on every request path (HTTP/1.1 and HTTP/2): the
client a proxy names is the right-most X-Forwarded-For entry that is not itself a trusted proxy;
gunicorn's `--forwarded-allow-ips` alone sets the scheme only (REMOTE_ADDR stays the peer); an
untrusted peer's headers change nothing. Each connection checks its peer once; these tests hold
every path to the same answer."""

from __future__ import annotations

import pytest
from support import h2client
from support.request_paths import OVER_TLS, every_path, flags, http2, tls

# What a client behind a proxy can send: its own X-Forwarded-For entry, to which the proxy
# appends the address it saw (203.0.113.9).
SPOOFED = [("x-forwarded-for", "198.51.100.1, 203.0.113.9"), ("x-forwarded-proto", "https")]


def _seen(server, path: str) -> tuple[str, str]:
    """(client address, scheme) as the app saw them."""
    if http2(path):
        client = h2client.H2Client(server.port, 10.0, tls=tls(path))
        try:
            status, body = client.request("GET", "/peer", fields=SPOOFED)
        finally:
            client.close()
    else:
        status, body = server.get("/peer", headers=dict(SPOOFED))
    assert status == 200, body
    address, _, scheme = body.decode().split(" ")
    return address, scheme


@pytest.fixture
def serve(start_server):
    def start(path: str, *args: str):
        chosen, app = flags(path, "apps.access_apps")
        return start_server(*chosen, *args, app=app, workers=1)

    return start


@every_path
def test_a_trusted_proxy_names_the_client_and_gunicorns_setting_the_scheme_only(serve, path):
    default = serve(path)  # refork's default: loopback proxies trusted, their client taken
    assert _seen(default, path) == ("203.0.113.9", "https")
    as_gunicorn = serve(path, "--forwarded-allow-ips", "*")  # gunicorn's meaning: the scheme only
    assert _seen(as_gunicorn, path) == ("127.0.0.1", "https")


@every_path
def test_an_untrusted_peer_changes_nothing(serve, path):
    untrusted = serve(path, "--forwarded-allow-ips", "192.0.2.1", "--forwarded-client", "on")
    assert _seen(untrusted, path) == ("127.0.0.1", "https" if path in OVER_TLS else "http")
