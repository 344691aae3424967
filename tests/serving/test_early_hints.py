"""103 Early Hints (RFC 8297) end to end, on every request path: WSGI's ``wsgi.early_hints``
(gunicorn's API) and ASGI's ``http.response.early_hint`` extension, with real servers and real
clients (raw sockets and curl for HTTP/1.1, the `h2` library for HTTP/2).

The app is tests/apps/hint_apps.py. The rules: each call is one 103, on the wire before the final
response; none to an HTTP/1.0 client (RFC 9110 15.2); none once the response head is out; a hint
that would split the response is an app error (a 500); a 500 may follow a 103.
"""

from __future__ import annotations

import socket
import subprocess

import h2.config
import h2.connection
import h2.events
import pytest
from apps.hint_apps import FONT, SCRIPT, STYLE
from conftest import read_to_end
from support.certs import Certs
from support.request_paths import (
    OVER_TLS,
    PATHS,
    connect,
    flags,
    http2,
    over_cleartext_only,
    path_certs,
    wsgi_paths,
)

HINT = b"HTTP/1.1 103 Early Hints"
TWO_HINTS = [
    HINT + b"\r\nLink: " + STYLE.encode(),
    HINT + b"\r\nLink: " + SCRIPT.encode() + b"\r\nLink: " + FONT.encode(),
]
ASGI = [path for path, (interface, _) in PATHS.items() if interface == "asgi"]


def _get(port: int, target: str, version: str = "1.1", requests: int = 1) -> bytes:
    """What the server answers `requests` pipelined GETs (the last with Connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        heads = [f"GET {target} HTTP/{version}\r\nHost: x\r\n" for _ in range(requests)]
        heads[-1] += "Connection: close\r\n"
        s.sendall("".join(head + "\r\n" for head in heads).encode())
        return read_to_end(s)


def _split(data: bytes) -> tuple[list[bytes], bytes]:
    """(the interim heads in front, the final response)."""
    interim = []
    while data.startswith(b"HTTP/1.1 1"):
        head, _, data = data.partition(b"\r\n\r\n")
        interim.append(head)
    return interim, data


@over_cleartext_only("HTTP/1.1 over TLS: test_hints_over_tls (curl --http1.1)")
def test_hints_go_before_the_final_response_on_http11_only(start_server, path):
    chosen, app = flags(path, "apps.hint_apps")
    server = start_server(*chosen, app=app, workers=1)
    port = server.port

    interim, final = _split(_get(port, "/"))
    assert interim == TWO_HINTS  # each call one 103, in order, values trimmed
    assert final.startswith(b"HTTP/1.1 200 OK\r\n") and final.endswith(b"\r\n\r\npage")

    data = _get(port, "/", version="1.0")  # no 1xx to an HTTP/1.0 client
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b" 103 " not in data and data.endswith(b"page")

    offered_10 = _split(_get(port, "/offered", version="1.0"))[1]
    assert _split(_get(port, "/offered"))[1].endswith(b"yes")
    # the WSGI callable is always there (gunicorn's), a no-op for HTTP/1.0; the ASGI extension is
    # offered only where it can be honoured
    assert offered_10.endswith(b"yes" if PATHS[path][0] == "wsgi" else b"no")

    interim, final = _split(_get(port, "/started"))  # after start_response, before the head left
    assert interim == TWO_HINTS[:1] and final.startswith(b"HTTP/1.1 200 OK\r\n")

    data = _get(port, "/late")  # after the head left: ignored, the response intact
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b" 103 " not in data
    assert b"pa" in data and b"ge" in data

    interim, final = _split(_get(port, "/error"))  # a 500 may follow a 103
    assert interim == TWO_HINTS[:1] and final.startswith(b"HTTP/1.1 500 ")

    data = _get(port, "/bad")  # CR LF in a value: the app's error, nothing split
    assert data.startswith(b"HTTP/1.1 500 ") and b"X-Split" not in data

    interim, final = _split(_get(port, "/", requests=3))  # keep-alive, pipelined: each its own
    assert interim == TWO_HINTS
    assert final.count(b"HTTP/1.1 200 OK\r\n") == 3 and final.count(HINT) == 4

    out = subprocess.run(["curl", "-sS", "-v", "--max-time", "20", f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.stdout == "page", out.stderr
    assert "< HTTP/1.1 103 Early Hints" in out.stderr and f"< Link: {STYLE}" in out.stderr


@wsgi_paths
def test_hints_never_wait_for_a_client_that_does_not_read(start_server, path, tmp_path):
    """Hints are advisory: past what the socket takes they are dropped, so 2000 of 4 KiB (8 MiB)
    to a client that reads nothing cost the app no wait; each 103 that went out is whole, and the
    response follows them intact."""
    done = tmp_path / "done"
    chosen, app = flags(path, "apps.hint_apps")
    server = start_server(*chosen, app=app, workers=1, env={"HINTS_DONE": str(done)})
    with connect(path, server.port, timeout=20) as s:  # (over TLS: HTTP/1.1 by ALPN)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        s.sendall(b"GET /many?2000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        server.wait_for(done.exists, what="the app, past its hints, with nothing read")
        interim, final = _split(read_to_end(s))
    assert 0 < len(interim) < 2000
    assert all(head.startswith(HINT + b"\r\nLink: </") and len(head) > 4096 for head in interim)
    assert final.startswith(b"HTTP/1.1 200 OK\r\n") and final.endswith(b"\r\n\r\npage")


class _H2:
    """An h2 client over a plain socket (h2c prior knowledge)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def get(self, sid: int, path: str) -> list[h2.events.Event]:
        """The events of stream `sid`, a GET of `path`, until it ends."""
        self.conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                     (":authority", "localhost")], end_stream=True)  # fmt: skip
        self.sock.sendall(self.conn.data_to_send())
        seen: list[h2.events.Event] = []
        while not any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in seen):
            data = self.sock.recv(65536)
            assert data, f"connection closed: {seen}"
            seen += [e for e in self.conn.receive_data(data) if getattr(e, "stream_id", None) == sid]
            self.sock.sendall(self.conn.data_to_send())
        return seen


def _heads(events: list[h2.events.Event]) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
    kinds = {h2.events.InformationalResponseReceived: "interim", h2.events.ResponseReceived: "final"}
    return [(kinds[type(e)], list(e.headers)) for e in events if type(e) in kinds]


@pytest.mark.parametrize("path", [p for p in PATHS if not http2(p)])  # (h2c is turned on here)
def test_hints_over_http2_are_informational_headers_before_the_response(start_server, path):
    chosen, app = flags(path, "apps.hint_apps")
    server = start_server(*chosen, "--http-protocols", "h2c,h1", app=app, workers=1)
    client = _H2(server.port)
    try:
        heads = _heads(client.get(1, "/"))
        assert heads[:2] == [
            ("interim", [(b":status", b"103"), (b"link", STYLE.encode())]),
            ("interim", [(b":status", b"103"), (b"link", SCRIPT.encode()), (b"link", FONT.encode())]),
        ]
        assert heads[2][0] == "final" and (b":status", b"200") in heads[2][1] and len(heads) == 3
        assert _heads(client.get(3, "/started"))[0] == heads[0]  # after the start, before the head
        assert [kind for kind, _ in _heads(client.get(5, "/late"))] == ["final"]  # ignored after the head
        heads = _heads(client.get(7, "/error"))
        assert [kind for kind, _ in heads] == ["interim", "final"] and (b":status", b"500") in heads[1][1]
        body = b"".join(e.data for e in client.get(9, "/offered") if isinstance(e, h2.events.DataReceived))
        assert body == b"yes"
    finally:
        client.sock.close()


@pytest.fixture
def certs() -> Certs:
    return path_certs()  # (the TLS paths' own, on those)


@pytest.mark.parametrize("path", list(PATHS))
def test_hints_over_tls(start_server, certs, path):
    """Over TLS (the WSGI engines hand such connections to the Python loop; both interfaces answer
    HTTP/2 by ALPN): curl sees the 103 before the 200 and the page, on HTTP/1.1 and HTTP/2."""
    chosen, app = flags(path, "apps.hint_apps")
    server = start_server(*chosen, *([] if path in OVER_TLS else certs.args()), app=app, workers=1)
    for version in ("--http1.1", "--http2"):
        url = f"https://127.0.0.1:{server.port}/"
        curl = ["curl", "-sS", "-v", version, "--max-time", "20", "--cacert", str(certs.ca_pem), url]
        out = subprocess.run(curl, capture_output=True, text=True, timeout=30)
        assert out.stdout == "page", out.stderr
        lines = [line.strip() for line in out.stderr.splitlines() if line.startswith("< ")]
        status = [line for line in lines if line.startswith("< HTTP/")]
        assert status[0] in ("< HTTP/1.1 103 Early Hints", "< HTTP/2 103") and status[-1].split()[2] == "200"
        assert len(status) == 3 and f"< link: {STYLE}" in [line.lower() for line in lines], out.stderr
