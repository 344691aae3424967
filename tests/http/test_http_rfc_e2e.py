"""RFC 9112 cases of issue 8, sent as exact bytes to a real server (the CLI, WSGI and ASGI).

Each is tested byte by byte against the parser in test_http_parser*.py; here the same bytes go
over a socket, whole and in small sends (separate reads, most likely: the answer must not depend
on it), to check what a client actually gets back.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from apps import Reader
from conftest import Server

H = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
TE = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
FIELD_LIMIT = 40  # --limit-request-field-size: small enough to cross with one field

APPS = {
    "wsgi": ("apps.wsgi_apps:raw", []),
    "asgi": ("apps.asgi_apps:app", ["--interface", "asgi"]),
}


@pytest.fixture(scope="module", params=sorted(APPS))
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    app, args = APPS[request.param]
    args = ["-w", "1", "--limit-request-field-size", str(FIELD_LIMIT), *args]
    srv = Server(tmp_path_factory.mktemp(request.param), args, app, None)
    try:
        srv.wait_ready(1)
        yield srv
    finally:
        srv.stop()


def exchange(
    server: Server, pieces: list[bytes], responses: int, closing: bool = True
) -> tuple[list[tuple[int, bytes]], bool]:
    """Send pieces (pausing between them), read `responses` responses; with `closing`, also
    whether the server then closed the connection (else the connection is left open)."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(0.005)
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break  # the server answered an error and closed before the last bytes: read it
        reader = Reader(sock)
        got = []
        for _ in range(responses):
            status, _, body = reader.response()
            got.append((status, body))
        return got, closing and reader.closed()
    finally:
        sock.close()


def ways(raw: bytes) -> list[list[bytes]]:
    """raw whole, and cut into pieces of 7 bytes."""
    return [[raw], [raw[i : i + 7] for i in range(0, len(raw), 7)]]


# --- 1. a protocol name other than HTTP (RFC 9112 2.3) ----------------------------------------


@pytest.mark.parametrize("how", ["whole", "pieces"])
def test_rtsp_is_refused_first_and_pipelined(server: Server, how: str) -> None:
    pick = 0 if how == "whole" else 1
    got, closed = exchange(server, ways(b"GET /echo RTSP/1.0\r\n\r\n")[pick], 1)
    assert got[0][0] == 400 and closed
    pipelined = H + b"POST /echo RTSP/1.0\r\nContent-Length: 2\r\n\r\nab" + H
    got, closed = exchange(server, ways(pipelined)[pick], 2)
    assert [status for status, _ in got] == [200, 400] and closed
    # An HTTP request that merely mentions RTSP/ is served.
    mention = b"POST /RTSP/1.0 HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\nGET / RTSP/1.0\n"
    got, _ = exchange(server, ways(mention)[pick], 1, closing=False)
    assert got[0][0] in (200, 404)


# --- 2. chunk extensions with BWS and quoted values (RFC 9112 7.1.1) ----------------------------


@pytest.mark.parametrize("how", ["whole", "pieces"])
def test_chunk_extensions_with_bws_are_served(server: Server, how: str) -> None:
    pick = 0 if how == "whole" else 1
    body = b'5 ; foo = bar\r\nhello\r\n5;a = b\r\n worl\r\n1;a="q v"\r\nd\r\n0 ; last = "1"\r\n\r\n'
    got, _ = exchange(server, ways(TE + body + TE + b"2\t;\tx\r\nhi\r\n0\r\n\r\n")[pick], 2, closing=False)
    assert got == [(200, b"hello world"), (200, b"hi")]


@pytest.mark.parametrize(
    "line",
    [b"5 \r\nhello\r\n", b"5 ;\r\nhello\r\n", b"5 ; a=b\nhello\r\n", b"5 ; a = b c\r\nhello\r\n"],
    ids=["space-no-ext", "empty-ext", "bare-lf", "space-in-value"],
)
def test_chunk_lines_the_rfc_forbids_are_refused(server: Server, line: bytes) -> None:
    got, closed = exchange(server, [TE + line + b"0\r\n\r\n"], 1)
    assert got[0][0] == 400 and closed


# --- 3. the status of a bad head does not depend on how its bytes were cut --------------------

LONG = b"X-Long: " + b"a" * (FIELD_LIMIT - 5) + b"\r\n"  # over the limit, yet within the slack the
# bound applies while a line is still arriving: it is found once its head is whole


@pytest.mark.parametrize(
    ("after", "status"),
    [(b"Expect; 100-continue\r\n", 400), (b"Expect: 100-continue\r\n", 431)],
    ids=["malformed-next-field", "well-formed-next-field"],
)
def test_status_is_the_same_whole_and_byte_by_byte(server: Server, after: bytes, status: int) -> None:
    raw = b"POST /echo HTTP/1.1\r\nHost: x\r\n" + LONG + after + b"Content-Length: 1\r\n\r\nx"
    for pieces in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
        got, closed = exchange(server, pieces, 1)
        assert got[0][0] == status and closed, pieces
