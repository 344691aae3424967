"""refork._native.http_scope (the ASGI loop's scope of a common request) against build_scope.

It must build the very scope build_scope builds, or decline (None) where only build_scope can: a
path to percent-decode or beyond ASCII, X-Forwarded-* fields from a trusted peer.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from refork import _native
from refork.asgi.scope import build_scope, http_scope
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies

PATHS = [b"/", b"/a/b.txt", b"/app/x", b"/app", b"/a%20b", b"/caf\xc3\xa9", b"/~user/;p=1"]
HEADERS = [[(b"host", b"h")], [(b"host", b"h"), (b"x-forwarded-for", b"10.0.0.1")], []]
VERSIONS = ["1.1", "1.0"]
ROOTS = ["", "/app"]
STATES: list[dict[str, Any] | None] = [None, {"db": "pool"}]
PROXIES = [None, TrustedProxies(["127.0.0.1"])]
PEERS: list[tuple[Any, Any]] = [(("127.0.0.1", 8000), ("127.0.0.1", 50000)), (("/tmp/s.sock", None), None)]


def test_the_loop_uses_the_native_scope() -> None:
    assert http_scope is _native.http_scope


@pytest.mark.parametrize("path", PATHS)
def test_the_native_scope_is_build_scopes(path: bytes) -> None:
    for headers, version, root, state, proxies, (server, client), scheme in itertools.product(
        HEADERS, VERSIONS, ROOTS, STATES, PROXIES, PEERS, ["http", "https"]
    ):
        request = Request("GET", path + b"?q=1", path, b"q=1", version, headers, True)
        got = http_scope(request, server=server, client=client, scheme=scheme, root_path=root, state=state,
                         proxies=proxies)  # fmt: skip
        expected = build_scope(request, server=server, client=client, scheme=scheme, root_path=root,
                               proxies=proxies, state=state)  # fmt: skip
        forwarded = proxies is not None and any(n.startswith(b"x-forwarded-") for n, _ in headers)
        if forwarded or b"%" in path or not path.isascii():
            assert got is None
            continue
        assert got == expected
        assert list(got) == list(expected)  # the same keys in the same order
        assert got["headers"] is request.headers and got["query_string"] is request.query
        if state is not None:
            assert got["state"] is not state


def test_each_scope_is_its_own() -> None:
    """An app may write to its scope: nothing in one is shared with the next but the request's own."""
    request = Request("GET", b"/", b"/", b"", "1.1", [(b"host", b"h")], True)
    where: dict[str, Any] = {"server": None, "client": None, "scheme": "http", "root_path": ""}
    first = http_scope(request, **where, state={"a": 1}, proxies=None)
    second = http_scope(request, **where, state={"a": 1}, proxies=None)
    assert first is not None and second is not None
    first["asgi"]["version"] = "x"
    first["extensions"]["http.response.trailers"]["x"] = 1
    first["state"]["b"] = 2
    assert second["asgi"] == {"version": "3.0", "spec_version": "2.4"}
    assert second["extensions"]["http.response.trailers"] == {} and second["state"] == {"a": 1}
