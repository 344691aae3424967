"""X-Forwarded-For/-Proto from the CLI, on every request path: applied when --forwarded-allow-ips
trusts the peer (127.0.0.1 by default), ignored when it does not. Each connection checks its peer
once; these tests hold every path to the same answer."""

from __future__ import annotations

import json
import urllib.request

import pytest

PATHS = {
    "wsgi-python": ("apps.wsgi_apps:app", "/environ", ["--wsgi-loop", "python", "--threads", "2"]),
    "wsgi-native": ("apps.wsgi_apps:app", "/environ", ["--wsgi-loop", "native", "--threads", "1"]),
    "asgi-asyncio": ("apps.asgi_apps:app", "/scope", ["--interface", "asgi", "--loop", "asyncio"]),
    "asgi-uvloop": ("apps.asgi_apps:app", "/scope", ["--interface", "asgi", "--loop", "uvloop"]),
}


def _seen(port: int, path: str) -> tuple[str, str]:
    """(scheme, client address) as the app saw them, for a request sent as if through a proxy."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        headers={"X-Forwarded-For": "203.0.113.7, 10.0.0.1", "X-Forwarded-Proto": "https"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        info = json.loads(response.read())
    if "wsgi.url_scheme" in info:
        return info["wsgi.url_scheme"], info["REMOTE_ADDR"]
    return info["scheme"], info["client"][0]


@pytest.mark.parametrize("path", list(PATHS))
def test_forwarded_headers_follow_the_trusted_proxies(start_server, path):
    app, probe, flags = PATHS[path]
    trusted = start_server(*flags, app=app, workers=1)
    assert _seen(trusted.port, probe) == ("https", "10.0.0.1")  # the right-most untrusted entry
    trusting_all = start_server(*flags, "--forwarded-allow-ips", "*", app=app, workers=1)
    assert _seen(trusting_all.port, probe) == ("https", "203.0.113.7")
    untrusted = start_server(*flags, "--forwarded-allow-ips", "192.0.2.1", app=app, workers=1)
    assert _seen(untrusted.port, probe) == ("http", "127.0.0.1")
