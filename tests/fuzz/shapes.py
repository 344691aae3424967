"""Rough readings of raw request bytes, for the KNOWN_DIFFERENCES predicates of test_http_fuzz.

Not a parser: each helper answers one question about bytes two real parsers disagreed on,
leniently enough to cover the mutated variants the fuzzer makes of the same case.
"""

from __future__ import annotations

import re

from refork.http.parser import FORBIDDEN_TRAILERS

TOKEN = rb"[-!#$%&'*+.^_`|~0-9A-Za-z]+"
COMMON_METHODS = frozenset(b"GET HEAD POST PUT DELETE OPTIONS PATCH TRACE CONNECT".split())


def request_line(region: bytes) -> list[bytes]:
    return region.split(b"\n", 1)[0].rstrip(b"\r").split(b" ")


def head(region: bytes) -> bytes:
    return region.split(b"\r\n\r\n", 1)[0]


def fields(region: bytes, name: bytes) -> list[bytes]:
    """Values of field `name` in region's head (and trailers: the whole region is searched)."""
    return [m.group(1).strip(b" \t") for m in re.finditer(rb"\n" + name + rb":([^\r\n]*)", region, re.I)]


CHUNK_LINE = re.compile(rb"\r\n\r\n[0-9a-fA-F]+([^\r\n]*)\r?\n|\r\n[0-9a-fA-F]+([ \t;][^\r\n]*)\r?\n")


def chunk_ext_lines(region: bytes) -> bool:
    """A chunk-size line with something after the size (an extension or whitespace)."""
    return any(m.group(1) or m.group(2) for m in CHUNK_LINE.finditer(region))


# The fields refork refuses in a trailer section (RFC 9110 6.5.1: framing, routing, request
# modifiers, authentication, response control, content processing), taken from the parser.
TRAILER_FIELD = re.compile(
    rb"\r\n0[^\r\n]*\r\n(?:[^\r\n]*\r\n)*?(" + b"|".join(map(re.escape, FORBIDDEN_TRAILERS)) + rb"):",
    re.IGNORECASE,
)


def forbidden_trailer(region: bytes) -> bool:
    """A field RFC 9110 6.5.1 rules out of trailers, after the last chunk (a rough reading of region)."""
    return bool(TRAILER_FIELD.search(region))


HOST_CHARS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:[]%"


# The methods llhttp parses itself (any other token is replayed by refork with a placeholder).
LLHTTP_METHODS = frozenset(
    b"DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH SEARCH"
    b" UNLOCK BIND REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY SUBSCRIBE"
    b" UNSUBSCRIBE PATCH PURGE MKCALENDAR LINK UNLINK SOURCE QUERY PRI".split()
)
METHOD_AT_LINE_START = re.compile(rb"(?:^|\n)(" + TOKEN + rb")(?: |\Z)")  # or a method cut short


def starts_like_llhttp_method(method: bytes) -> bool:
    """An unknown token method that begins like one llhttp knows (FOO, PUX, POSTX): llhttp
    reads its first bytes as a method of its own before it fails."""
    return bool(method) and method not in LLHTTP_METHODS and method[:1] in b"ABCDFGHLMNOPQRSTU"
