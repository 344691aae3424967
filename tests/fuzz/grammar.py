"""A Hypothesis grammar of HTTP/1.1 requests, byte mutations, and feed() cut points.

The grammar is deliberately wider than RFC 9112: it draws valid shapes most of the time and the
edge cases a strict reader argues about (token methods, HTTP/1.2, chunk extensions with BWS, CL
with TE, obs-text, forbidden trailers, ...) often enough that every run meets them. Mutations then
break the bytes where parsers tend to disagree: CR, LF, NUL, SP, HTAB, separators, duplication,
truncation. Seeds come from the parser's own corpus (tests/http/test_http_parser.py), imported, not copied.
"""

from __future__ import annotations

from hypothesis import strategies as st
from support.http_vectors import INVALID, VALID

CORPUS: list[bytes] = [raw for _, raw, _ in INVALID] + [raw for _, raw, _ in VALID]

METHODS = [b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE", b"PURGE"]
ODD_METHODS = [
    b"CONNECT",
    b"X-SYNC",
    b"FOO",
    b"get",
    b"M-SEARCH",
    b"PRI",
    b"PUX",
    b"QUERY",
    b"DESCRIBE",
    b"SOURCE",
]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0"]
ODD_VERSIONS = [
    b"HTTP/1.2",
    b"HTTP/1.9",
    b"HTTP/2.0",
    b"HTTP/0.9",
    b"RTSP/1.0",
    b"ICE/1.0",
    b"http/1.1",
    b"HTTP/1.01",
]
HOSTS = [b"a", b"example.com", b"example.com:8080", b"[::1]:8000", b"127.0.0.1", b""]
ODD_HOSTS = [b"a b", b"a/b", b"user@a", b"a\x80"]
FIELD_NAMES = [b"X-A", b"Accept", b"User-Agent", b"Cookie", b"X-Forwarded-For", b"Upgrade", b"Expect"]
FIELD_VALUES = [
    b"1",
    b"a b",
    b"",
    b"text/html, */*;q=0.8",
    b'"quoted"',
    b"\xc3\xa9",
    b"a\tb",
    b"100-continue",
    b"a\x0bb",
    b"a\x7f",
]
TE_VALUES = [
    b"chunked",
    b"Chunked",
    b"gzip, chunked",
    b", chunked",
    b"chunked,",
    b"chunked, identity",
    b"identity",
]
CL_VALUES = [b"1, 1", b"+1", b"-1", b"0x1", b" ", b"1 1", b"99999999999999999999"]
FORBIDDEN_TRAILERS = [
    *(b"Host", b"Content-Length", b"Transfer-Encoding", b"Connection", b"Te", b"Trailer"),
    *(b"Authorization", b"Content-Type", b"Range", b"Cache-Control", b"Set-Cookie"),
]
CHUNK_EXTS = [
    *(b"", b";a=b", b';a="q s"', b";a", b" ; a = b", b";a= b", b";", b";a=\x01", b';a=";"'),
    *(b'\t;\ta\t=\t"x\\" y"', b";a =b ; c", b" ", b" ;", b";a = b c"),  # BWS (RFC 9112 7.1.1) and not
]
OWS = [b"", b" ", b"\t", b"  "]
SPECIAL_BYTES = b'\r\n\x00 \t:;,\x7f\x80"'


def _odd(common: list[bytes], odd: list[bytes]) -> st.SearchStrategy[bytes]:
    """Mostly the common values, sometimes an edge case."""
    return st.one_of(st.sampled_from(common), st.sampled_from(odd))


@st.composite
def targets(draw: st.DrawFn) -> bytes:
    segment = st.text("abcxyz019-._~%!$&'()*+,;=:@", max_size=6).map(str.encode)
    path = b"/" + b"/".join(draw(st.lists(segment, max_size=3)))
    query = draw(st.sampled_from([b"", b"?x=1", b"?a=1?b", b"?"]))
    fragment = draw(st.sampled_from([b"", b"", b"#f"]))
    origin = path + query + fragment
    return draw(
        st.sampled_from(
            [origin, origin, origin, b"*", b"http://x.com" + origin, b"http://x.com", b"x", b"//a"]
            + [b"https://t.example:8443" + origin, b"ftp://x.com/"]
        )
    )


@st.composite
def chunked_body(draw: st.DrawFn) -> bytes:
    out = []
    for data in draw(st.lists(st.binary(min_size=1, max_size=20), max_size=3)):
        size = draw(st.sampled_from([b"%x", b"%X", b"0%x", b"%02x"])) % len(data)
        out.append(size + draw(st.sampled_from(CHUNK_EXTS)) + b"\r\n" + data + b"\r\n")
    last = draw(st.sampled_from([b"0", b"0", b"00"]))  # the last-chunk, its zeros padded at times
    out.append(last + draw(st.sampled_from(CHUNK_EXTS)) + b"\r\n")
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.one_of(st.sampled_from(FIELD_NAMES), st.sampled_from(FORBIDDEN_TRAILERS)))
        out.append(name + b":" + draw(st.sampled_from(OWS)) + draw(st.sampled_from(FIELD_VALUES)) + b"\r\n")
    out.append(b"\r\n")
    return b"".join(out)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """One request: line, fields (framing included), body to match (or not)."""
    method = draw(_odd(METHODS, ODD_METHODS))
    version = draw(st.one_of(*[st.just(v) for v in VERSIONS] * 6, st.sampled_from(ODD_VERSIONS)))
    sp = draw(st.sampled_from([b" "] * 8 + [b"  "]))
    fields: list[bytes] = []
    for _ in range(draw(st.sampled_from([1, 1, 1, 1, 0, 2]))):
        fields.append(b"Host: " + draw(_odd(HOSTS * 4, ODD_HOSTS)))
    for _ in range(draw(st.integers(0, 3))):
        ows = draw(st.sampled_from(OWS))
        fields.append(
            draw(st.sampled_from(FIELD_NAMES)) + b":" + ows + draw(st.sampled_from(FIELD_VALUES)) + ows
        )
    if draw(st.booleans()):
        fields.append(
            b"Connection: " + draw(st.sampled_from([b"close", b"keep-alive", b"upgrade", b"x, Close"]))
        )
    framing = draw(st.sampled_from(["none", "cl", "cl", "chunked", "chunked", "cl-odd", "te-odd", "cl+te"]))
    body = b""
    if framing in ("cl", "cl+te"):
        body = draw(st.binary(max_size=24))
        fields.append(b"Content-Length:" + draw(st.sampled_from(OWS)) + b"%d" % len(body))
        if draw(st.integers(0, 5)) == 0:  # a duplicate, equal or not
            fields.append(
                b"Content-Length: " + draw(st.sampled_from([b"%d" % len(body), b"%d" % (len(body) + 1)]))
            )
    if framing in ("chunked", "cl+te"):
        fields.append(
            b"Transfer-Encoding:" + draw(st.sampled_from(OWS)) + draw(st.sampled_from(TE_VALUES[:2]))
        )
        body = draw(chunked_body())
    if framing == "cl-odd":
        fields.append(b"Content-Length: " + draw(st.sampled_from(CL_VALUES)))
        body = b"a"
    if framing == "te-odd":
        fields.append(b"Transfer-Encoding: " + draw(st.sampled_from(TE_VALUES)))
        body = draw(chunked_body())
    fields = draw(st.permutations(fields))
    head = method + sp + draw(targets()) + sp + version + b"\r\n" + b"".join(f + b"\r\n" for f in fields)
    return head + b"\r\n" + body


pipelines = st.lists(requests(), min_size=1, max_size=3).map(b"".join)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[bytes]) -> bytes:
    """base with up to three edits: bit flips, special-byte insertions, duplications, cuts."""
    raw = bytearray(draw(base))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["flip", "insert", "insert", "replace", "duplicate", "delete", "truncate"]))
        at = draw(st.integers(0, len(raw)))
        if op == "flip" and at < len(raw):
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            raw[at:at] = bytes([draw(st.sampled_from(SPECIAL_BYTES))]) * draw(st.integers(1, 2))
        elif op == "replace" and at < len(raw):
            raw[at] = draw(st.sampled_from(SPECIAL_BYTES))
        elif op == "duplicate":
            end = draw(st.integers(at, min(len(raw), at + 40)))
            raw[end:end] = raw[at:end]
        elif op == "delete":
            del raw[at : at + draw(st.integers(1, 4))]
        elif op == "truncate":
            del raw[at:]
    return bytes(raw)


generated = st.one_of(pipelines, st.sampled_from(CORPUS))
single = st.one_of(generated, mutated(generated))
# Pipelines of broken messages too: what one message leaves behind is the next one's start.
fuzzed = st.one_of(single, single, st.lists(single, min_size=2, max_size=3).map(b"".join))


@st.composite
def cut_points(draw: st.DrawFn, raw: bytes) -> list[int]:
    """Where to split raw into feed() calls: sorted, inside the data."""
    if len(raw) < 2:
        return []
    return sorted(set(draw(st.lists(st.integers(1, len(raw) - 1), max_size=8))))
