"""The Python side of the rules the native engines implement too, held to the same tables
(tests/vectors/; the Rust side reads them in `cargo test`)."""

from __future__ import annotations

from email.utils import formatdate

import pytest
from support import paths

from refork.http.events import Request
from refork.http.parser import RequestParser
from refork.http.response import ResponseFramer
from refork.serving.connection import Expiry, Phase, Timeouts, peer_text, write_timeout_line
from refork.serving.health import HealthPaths

VECTORS = paths.TESTS / "vectors"
NOW = 1000.0


def rows(name: str) -> list[list[str]]:
    """A table's rows: fields split at " | ", comments and empty lines left out, escapes read."""
    out = []
    for line in (VECTORS / name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            out.append([_unescape(field.strip()) for field in line.split(" | ")])
    return out


def _unescape(field: str) -> str:
    return field.replace("\\r", "\r").replace("\\n", "\n").replace("\\t", "\t").replace("\\0", "\0")


@pytest.mark.parametrize("row", rows("sweep.txt"), ids=" | ".join)
def test_the_deadline_verdicts(row):
    phase, age, received, min_rate, keepalive, fresh, drain, verdict = row
    t = Timeouts(header=10.0, body=20.0, write=30.0, keepalive=float(keepalive),
                 body_min_rate=float(min_rate))
    since = NOW - float(age)
    if phase == "writing":  # (a blocked write's clock: write_stalled)
        got = "write-timeout" if t.write_stalled(since, NOW) else "none"
    else:
        drain_until = 0.0 if drain == "-" else NOW + float(drain)
        expiry = t.expiry(Phase[phase.upper()], since, NOW, drain_until, int(received), fresh == "yes")
        got = {Expiry.NONE: "none", Expiry.CLOSE: "close", Expiry.REQUEST_TIMEOUT: "request-timeout"}[expiry]
    assert got == verdict


@pytest.mark.parametrize("row", rows("peer.txt"), ids=" | ".join)
def test_the_peer_text(row):
    host, port, text = row
    assert peer_text(None if host == "-" else (host, int(port))) == text


@pytest.mark.parametrize("row", rows("health.txt"), ids=lambda row: " | ".join(row).replace("\r\n", " "))
def test_the_health_check_match(row):
    request, verdict = row
    head = RequestParser().feed(request.encode("latin-1"))[0]
    assert isinstance(head, Request)
    assert (HealthPaths("/healthz").check(head) or "app") == verdict


@pytest.mark.parametrize("row", rows("write_timeout.txt"), ids=lambda row: " | ".join(row[:5]))
def test_the_write_timeout_line(row):
    host, port, what, timeout, cut, line = row
    request = None
    if what != "-":
        head = RequestParser().feed(f"{what} HTTP/1.1\r\nHost: a\r\n\r\n".encode("latin-1"))[0]
        assert isinstance(head, Request)
        request = head
    client = None if host == "-" else (host, int(port))
    assert write_timeout_line(float(timeout), client, request, cut) == line


@pytest.mark.parametrize("row", rows("date.txt"), ids=" | ".join)
def test_the_date_line(row):
    assert formatdate(int(row[0]), usegmt=True) == row[1]


@pytest.mark.parametrize("row", rows("framing.txt"), ids=lambda row: " | ".join(row[:4]))
def test_the_framing_of_a_list_body(row):
    (method, version, keep), status, fields, pieces, sent, kept = row[0].split(" "), int(row[1]), *row[2:]
    request = Request(method, b"/", b"/", b"", version, [(b"host", b"a")], keep == "keep")
    split = [f.encode("latin-1").split(b": ", 1) for f in fields.split("; ")] if fields != "-" else []
    headers = [(name, value) for name, value in split]
    body = [] if pieces == "-" else [p.encode() for p in pieces.split("+")]
    if not any(name.lower() == b"content-length" for name, _ in headers):  # as the WSGI layer adds it
        headers.append((b"Content-Length", b"%d" % sum(map(len, body))))
    framer = ResponseFramer(request)
    try:
        out = framer.head(status, headers) + b"".join(framer.body(p) for p in body) + framer.end()
    except ValueError:
        assert sent == "error"
        return
    head, _, rest = out.partition(b"\r\nDate: ")
    masked = head + b"\r\nDate: *" + rest[rest.index(b"\r\n") :]
    assert masked.decode("latin-1") == sent
    assert ("kept" if framer.keep_alive else "closed") == kept
