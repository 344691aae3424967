"""What a valid request head is, beyond what llhttp checks: the tables and rules
refork.http.parser applies to every request head (and trailer section).

llhttp in its default (strict) mode already rejects, and we rely on it (each is pinned by a test):
Content-Length with Transfer-Encoding, duplicate Content-Length (even equal values), non-digit /
signed / overflowing Content-Length, Transfer-Encoding whose final coding is not ``chunked``,
bad chunk sizes and extensions, non-token header names, whitespace before the colon, CTL / NUL in
values, obs-fold, bare CR and bare LF, control characters in the target. Its one leniency we turn
on is the version digits (``lenient_version``): which HTTP/1.x to serve is decided by the parser.

What llhttp accepts and refork.http.parser rejects:

- HTTP/0.9 (``GET /``), any major version but 1 and the ``PRI`` preface -> 505. HTTP/1.2 and
  later minors are served as 1.1 (RFC 9112 2.3).
- ``Transfer-Encoding`` other than one ``chunked`` after empty list elements are dropped
  (``gzip, chunked`` -> 501; two TE fields -> 400), and any Transfer-Encoding on an HTTP/1.0
  request -> 400 (RFC 9112 6.1).
- Missing ``Host`` on HTTP/1.1, more than one ``Host``, or one with characters outside
  RFC 3986 host[:port] (spaces, ``/``, ``@``, ``?``, ``#``, ``"``, ...) -> 400 (RFC 9112 3.2).
- ``CONNECT`` -> 501: this is an origin server, not a proxy. ``*`` as the target of anything
  but OPTIONS -> 400 (RFC 9112 3.2.4).
- An ``Upgrade`` request with a chunked body -> 400. (With a Content-Length body we read the body
  ourselves: llhttp would treat it as the upgraded protocol, a smuggling vector.)
- Limits: request line -> 414, header count / one field / whole head -> 431, body -> 413; a
  chunk-size line -> 400 and a trailer section -> 431, counted as they arrive like a head.
- Trailer fields RFC 9110 6.5.1 rules out (refork.http.head.FORBIDDEN_TRAILERS) -> 400.

The per-request checks stay inline in RequestParser.on_headers_complete (the hot path: no extra
call per request); what is here is the data they read and the rules of the rare shapes (a
Transfer-Encoding other than ``chunked``, an absolute-form target), as pure functions that raise
:class:`ParseError` (the parser records it).
"""

from __future__ import annotations

from dataclasses import dataclass

from refork.http.events import ParseError

__all__ = [
    "CONNECTION",
    "CONTENT_LENGTH",
    "EXPECT",
    "FORBIDDEN_TRAILERS",
    "GOOD_HOSTS",
    "HOST",
    "HOST_CHARS",
    "Limits",
    "METHODS",
    "SPECIAL",
    "TCHAR",
    "TRANSFER_ENCODING",
    "absolute_form",
    "transfer_codings",
]

# Header names that change framing or connection handling; everything else is just stored.
HOST = b"host"
CONTENT_LENGTH = b"content-length"
TRANSFER_ENCODING = b"transfer-encoding"
CONNECTION = b"connection"
EXPECT = b"expect"
SPECIAL = frozenset((HOST, CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION, EXPECT))

# uri-host [":" port] characters (RFC 3986 reg-name / IP-literal). Checked because apps build URLs
# from Host; validated values are remembered, a server sees few distinct hosts.
HOST_CHARS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:[]%"
GOOD_HOSTS: set[bytes] = set()

# Interned method strings: a dict hit is cheaper than decoding, and equal strings share memory.
METHODS = {
    m.encode(): m
    for m in (
        *("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"),
        *("PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK", "SEARCH", "REPORT"),
        *("MKACTIVITY", "CHECKOUT", "MERGE", "PURGE", "QUERY"),
    )
}

# Trailer fields that must not be sent in a trailer section (RFC 9110 6.5.1): a recipient that
# merged them into the header section would let a client change framing, routing, request
# modifiers, authentication, response control or content processing after the fact. Trailers are
# dropped here anyway; refusing these keeps a downstream that does merge from being fooled.
FORBIDDEN_TRAILERS = frozenset(
    (
        *(b"content-length", b"transfer-encoding", b"trailer", b"te"),  # message framing
        *(b"connection", b"keep-alive", b"upgrade", b"proxy-connection"),  # connection control
        *(b"host", b":authority"),  # routing
        *(b"cache-control", b"expect", b"max-forwards", b"pragma", b"range"),  # request controls
        *(b"if-match", b"if-none-match", b"if-modified-since", b"if-unmodified-since", b"if-range"),
        *(b"authorization", b"proxy-authorization", b"cookie"),  # authentication
        *(b"www-authenticate", b"proxy-authenticate", b"set-cookie"),
        *(b"age", b"date", b"expires", b"location", b"retry-after", b"vary", b"warning"),  # response control
        *(b"content-encoding", b"content-type", b"content-range", b"content-language"),  # processing
    )
)

# Characters of an RFC 9110 token: any token is a method (RFC 9110 9.1).
TCHAR = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True, slots=True)
class Limits:
    """Per-request size limits; each has the status it produces when exceeded."""

    max_request_line: int = 8190  # -> 414
    max_header_count: int = 100  # -> 431
    max_header_size: int = 8190  # one field, name + value -> 431
    max_body: int = 1 << 30  # 0 = unlimited -> 413


def transfer_codings(te: bytes) -> None:
    """Transfer-Encoding other than exactly b"chunked": empty list elements are allowed
    (RFC 9110 5.6.1), chunked must be last and once (RFC 9112 6.3), others are not done."""
    codings = [c for c in (c.strip(b" \t") for c in te.split(b",")) if c]
    if codings == [b"chunked"]:
        return
    if codings and codings[-1] == b"chunked" and b"chunked" not in codings[:-1]:
        raise ParseError(501, "transfer coding not implemented")
    raise ParseError(400, "invalid Transfer-Encoding")


def absolute_form(url: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """Path and query of an absolute-form target, and the headers with Host replaced by the
    target's authority: RFC 9112 3.2.2 says the Host field is then ignored."""
    scheme, sep, rest = url.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        raise ParseError(400, "invalid request target")
    end = len(rest)
    for stop in b"/?#":
        at = rest.find(bytes((stop,)))
        if 0 <= at < end:
            end = at
    authority = rest[:end]
    if not authority or authority.translate(None, HOST_CHARS):
        raise ParseError(400, "invalid authority in the request target")
    target = rest[end:]
    if not target.startswith(b"/"):
        target = b"/" + target
    replaced = [(n, authority) if n == HOST else (n, v) for n, v in headers]
    if not any(n == HOST for n, _ in headers):
        replaced.append((HOST, authority))  # HTTP/1.0 without Host: the target names it
    return target, replaced
