"""The known ways refork and h11 read the same bytes differently, each with its RFC reason.

test_http_fuzz's differential test fails on any disagreement between the two parsers unless one
of these accounts for it; a framing difference (both serve, but split the bytes differently)
never does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from fuzz.drivers import Divergence, divergence, h11_outcome, refork_outcome
from fuzz.shapes import (
    COMMON_METHODS,
    HOST_CHARS,
    TOKEN,
    chunk_ext_lines,
    fields,
    forbidden_trailer,
    head,
    request_line,
    starts_like_llhttp_method,
)
from refork.http.parser import Limits

H = b"GET / HTTP/1.1\r\nHost: a\r\n"
P = b"POST / HTTP/1.1\r\nHost: a\r\n"
TE = P + b"Transfer-Encoding: chunked\r\n"


# Who reads the example as the RFC asks, refork taken at refork_accepts (what it does once any
# pending fix lands); "both": the RFC allows either reading, or the two agree after the fix.
Right = Literal["refork", "h11", "both"]


@dataclass(frozen=True)
class KnownDifference:
    """A way refork and h11 read the same bytes differently, and what RFC 9110/9112 says."""

    name: str
    example: bytes
    rfc: str  # the rule, cited
    right: Right
    refork_accepts: bool  # what refork should do with example (the RFC's, or refork's chosen, answer)
    h11_accepts: bool  # what h11 0.16 does with example (pinned: an h11 upgrade is noticed)
    # "accepts": reads every byte without refusing any (complete messages, or waiting for more)
    applies: Callable[[bytes, bytes], bool]  # (previous message, divergent region) -> explains it?
    pending: bool = False  # refork does not do refork_accepts yet: the parser fix is in progress


KNOWN_DIFFERENCES = [
    KnownDifference(
        "obs-fold",
        H + b"X-A: a\r\n b\r\n\r\n",
        "RFC 9112 5.2: a server MUST either reject obs-fold with 400 or replace it with SP",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: bool(re.search(rb"\n[ \t]", region)),
    ),
    KnownDifference(
        "bare-lf",
        b"GET / HTTP/1.1\nHost: a\n\n",
        "RFC 9112 2.2: a recipient MAY recognize a single LF as a line terminator",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: bool(re.search(rb"(?<!\r)\n", region)),
    ),
    KnownDifference(
        "leading-empty-line",
        b"\r\n" + H + b"\r\n",
        "RFC 9112 2.2: a server SHOULD ignore at least one empty line received before the request-line",
        "refork",
        refork_accepts=True,
        h11_accepts=False,
        applies=lambda prev, region: region.startswith((b"\r", b"\n")),
    ),
    KnownDifference(
        "token-method",
        b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\n",
        "RFC 9110 9.1: method = token; llhttp knows a fixed list",
        "both",
        refork_accepts=True,
        h11_accepts=True,
        applies=lambda prev, region: (
            bool(re.fullmatch(TOKEN, request_line(region)[0]))
            and request_line(region)[0] not in COMMON_METHODS
        ),
    ),
    KnownDifference(
        "token-method-cut-inside-a-known-prefix",
        b"FOO / HTTP/1.1\r\nHost: a\r\n\r\n",
        "RFC 9110 9.1: method = token; refork serves FOO however its bytes arrive (it once refused"
        " it fed byte by byte: see FIXED_PARSER_BUGS)",
        "both",
        refork_accepts=True,
        h11_accepts=True,
        applies=lambda prev, region: starts_like_llhttp_method(request_line(region)[0]),
    ),
    KnownDifference(
        "lowercase-method",
        b"get / HTTP/1.1\r\nHost: a\r\n\r\n",
        "RFC 9110 9.1: methods are case-sensitive tokens; `get` is an unknown method, not GET",
        "both",
        refork_accepts=True,
        h11_accepts=True,
        applies=lambda prev, region: request_line(region)[0] in (b"get", b"post", b"head"),
    ),
    KnownDifference(
        "http-1.2",
        b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
        "RFC 9112 2.3 / RFC 9110 6.2: a higher minor version is served as the highest supported (1.1)",
        "both",
        refork_accepts=True,
        h11_accepts=True,
        applies=lambda prev, region: bool(
            re.search(rb" HTTP/1\.[2-9]\r?\n", region.split(b"\n", 1)[0] + b"\n")
        ),
    ),
    KnownDifference(
        "other-major-version",
        b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
        "RFC 9110 15.6.6: 505 for an unsupported major version; h11 parses HTTP/2.0 as if 1.x",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: bool(re.search(rb" HTTP/[02-9]\.[0-9]\r?$", region.split(b"\n", 1)[0])),
    ),
    KnownDifference(
        "non-http-protocol",
        b"GET / RTSP/1.0\r\n\r\n",
        'RFC 9112 2.3: HTTP-name is %s"HTTP"; llhttp reads RTSP/1.0 as HTTP/1.0, refork refuses it',
        "both",
        refork_accepts=False,
        h11_accepts=False,
        applies=lambda prev, region: not request_line(region)[-1].startswith(b"HTTP/"),
    ),
    KnownDifference(
        "pri-method",
        b"PRI / HTTP/1.0\r\n\r\n",
        "RFC 9113 3.4 / 11.6: PRI is reserved for the HTTP/2 preface and never sent by a real client."
        " llhttp expects the preface after any PRI line: 400 once more bytes come, and until then"
        " the head is not complete (the client waits for --header-timeout)",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: region.startswith(b"PRI "),
    ),
    KnownDifference(
        "extra-spaces-in-request-line",
        b"GET  /  HTTP/1.1\r\nHost: a\r\n\r\n",
        "RFC 9112 3: recipients MAY parse the request-line on whitespace-delimited word boundaries",
        "both",
        refork_accepts=True,
        h11_accepts=False,
        applies=lambda prev, region: b"  " in region.split(b"\n", 1)[0],
    ),
    KnownDifference(
        "target-form",
        b"GET x HTTP/1.1\r\nHost: a\r\n\r\n",
        "RFC 9112 3.2: origin-form starts with /, absolute-form has a scheme; h11 takes any VCHARs",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: (
            len(request_line(region)) > 1
            and not request_line(region)[1].startswith(b"/")
            and request_line(region)[1] != b"*"  # the asterisk-form: see asterisk-not-options
        ),
    ),
    KnownDifference(
        "asterisk-not-options",
        b"GET * HTTP/1.1\r\nHost: a\r\n\r\n",
        "RFC 9112 3.2.4: the asterisk-form is only used for a server-wide OPTIONS",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: request_line(region)[1:2] == [b"*"],
    ),
    KnownDifference(
        "connect",
        b"CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n",
        "RFC 9110 9.3.6 / 15.6.2: CONNECT is for proxies; an origin server answers 501",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: region.startswith(b"CONNECT "),
    ),
    KnownDifference(
        "http-1.2-without-host",
        b"GET / HTTP/1.2\r\n\r\n",
        "RFC 9112 3.2: a server MUST answer 400 to an HTTP/1.1 request without Host, and a higher"
        " minor version is served as 1.1 (RFC 9110 6.2); h11 asks Host of 1.1 only",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: (
            bool(re.search(rb" HTTP/1\.[2-9]\r?\n", region.split(b"\n", 1)[0] + b"\n"))
            and not fields(head(region), b"host")
        ),
    ),
    KnownDifference(
        "invalid-host",
        b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
        "RFC 9112 3.2: a server MUST answer 400 to a Host with an invalid value (RFC 3986 host[:port])",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: any(
            v.translate(None, HOST_CHARS) for v in fields(head(region), b"host")
        ),
    ),
    KnownDifference(
        "ctl-in-field-value",
        H + b"X-A: a\x7fb\r\n\r\n",
        "RFC 9110 5.5: field-vchar is VCHAR / obs-text; DEL and the other CTLs (but HTAB) are not"
        " allowed; h11 takes any byte but CR, LF and NUL",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: bool(re.search(rb"\n[^\r\n]*[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]", region)),
    ),
    KnownDifference(
        "content-length-and-transfer-encoding",
        P + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + H + b"\r\n",
        "RFC 9112 6.1: a server MAY reject CL with TE, and MUST close the connection after responding"
        " in any case; h11 serves it by TE and keeps the connection",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: bool(
            fields(region, b"content-length") and fields(region, b"transfer-encoding")
        ),
    ),
    KnownDifference(
        "transfer-encoding-in-http10",
        b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "RFC 9112 6.1: an HTTP/1.0 message with Transfer-Encoding MUST be treated as having faulty framing",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: (
            b"HTTP/1.0" in region.split(b"\n", 1)[0] and bool(fields(region, b"transfer-encoding"))
        ),
    ),
    KnownDifference(
        "transfer-encoding-empty-element",
        P + b"Transfer-Encoding: , chunked\r\n\r\n0\r\n\r\n",
        "RFC 9110 5.6.1: a recipient MUST accept (and ignore) empty list elements",
        "refork",
        refork_accepts=True,
        h11_accepts=False,
        applies=lambda prev, region: any(
            v.strip(b", \t").lower() == b"chunked" for v in fields(head(region), b"transfer-encoding")
        ),
    ),
    KnownDifference(
        "duplicate-content-length",
        P + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\na",
        "RFC 9110 8.6: a recipient MAY reject duplicated equal Content-Length values or use one of them",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: (
            len(fields(head(region), b"content-length")) > 1
            or any(b"," in v for v in fields(head(region), b"content-length"))
        ),
    ),
    KnownDifference(
        "content-length-overflow",
        P + b"Content-Length: 99999999999999999999\r\n\r\n",
        "RFC 9110 8.6: recipients MUST prevent integer overflow on large Content-Length; refork answers"
        " 400, h11 (Python ints) waits for 10^20 bytes",
        "refork",
        refork_accepts=False,
        h11_accepts=True,  # h11 waits for the body
        applies=lambda prev, region: any(len(v) > 18 for v in fields(head(region), b"content-length")),
    ),
    KnownDifference(
        "content-length-over-limit",
        P + b"Content-Length: 999999999999999999\r\n\r\n",
        "RFC 9110 15.5.14: a server may refuse content larger than it is willing to process (413);"
        " refork's --limit-request-body (1 GiB by default) applies before the body is read",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: any(
            v.isdigit() and int(v) > Limits().max_body for v in fields(head(region), b"content-length")
        ),
    ),
    KnownDifference(
        "chunk-size-trailing-whitespace",
        TE + b"\r\n5 \r\nhello\r\n0\r\n\r\n",
        "RFC 9112 7.1: chunk = chunk-size [ chunk-ext ] CRLF; BWS is allowed only before a `;`",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: chunk_ext_lines(region),
    ),
    KnownDifference(
        "chunk-ext-empty",
        TE + b"\r\n5;\r\nhello\r\n0\r\n\r\n",
        "RFC 9112 7.1.1: chunk-ext-name is a token (non-empty); h11 skips anything after `;`",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: chunk_ext_lines(region),
    ),
    KnownDifference(
        "chunk-ext-ctl",
        TE + b"\r\n5;a=\x01\r\nhello\r\n0\r\n\r\n",
        "RFC 9112 7.1.1: chunk-ext-val is a token or quoted-string; h11 skips anything after `;`",
        "refork",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: chunk_ext_lines(region),
    ),
    KnownDifference(
        "chunk-ext-bws-around-equals",
        TE + b"\r\n5;a = b\r\nhello\r\n0\r\n\r\n",
        'RFC 9112 7.1.1: chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] );'
        " llhttp refuses the BWS, refork reads such lines itself (refork.http.chunked)",
        "both",
        refork_accepts=True,
        h11_accepts=True,
        applies=lambda prev, region: chunk_ext_lines(region),
    ),
    KnownDifference(
        "chunk-ext-bws-before-semicolon",
        TE + b"\r\n5 ; a = b\r\nhello\r\n0\r\n\r\n",
        "RFC 9112 7.1.1: BWS is allowed before `;`; h11 refuses it",
        "refork",
        refork_accepts=True,
        h11_accepts=False,
        applies=lambda prev, region: chunk_ext_lines(region),
    ),
    KnownDifference(
        "content-length-trailer",
        TE + b"\r\n0\r\nContent-Length: 5\r\n\r\n",
        "RFC 9110 6.5.1: framing fields (Content-Length) must not be sent as trailers; llhttp refuses"
        " it, h11 takes it as a trailer",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: forbidden_trailer(region),
    ),
    KnownDifference(
        "host-trailer",
        TE + b"\r\n0\r\nHost: b\r\n\r\n",
        "RFC 9110 6.5.1: routing fields (Host) must not be sent as trailers; refork refuses them,"
        " h11 takes it as a trailer",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: forbidden_trailer(region),
    ),
    KnownDifference(
        "request-control-trailer",
        TE + b"\r\n0\r\nAuthorization: 1\r\n\r\n",
        "RFC 9110 6.5.1: a sender MUST NOT generate a trailer field whose definition does not permit"
        " it (authentication, request modifiers, response control, content format); refork refuses"
        " these with 400 so no downstream that merges trailers is fooled, h11 takes them",
        "both",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: forbidden_trailer(region),
    ),
    KnownDifference(
        "upgrade-with-chunked-body",
        TE + b"Connection: upgrade\r\nUpgrade: h2c\r\n\r\n0\r\n\r\n",
        "RFC 9110 7.8: a server may ignore Upgrade and serve the request, chunked body included; refork"
        " refuses it on purpose (llhttp would hand the body to the new protocol: a smuggling vector)",
        "h11",
        refork_accepts=False,
        h11_accepts=True,
        applies=lambda prev, region: bool(
            fields(head(region), b"upgrade") and fields(head(region), b"transfer-encoding")
        ),
    ),
    KnownDifference(
        "http10-keep-alive",
        b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + H + b"\r\n",
        "RFC 9112 9.3 / C.2.2: persistence for HTTP/1.0 (Connection: keep-alive) is optional; h11 always"
        " closes after an HTTP/1.0 request",
        "both",
        refork_accepts=True,
        h11_accepts=False,
        applies=lambda prev, region: b"HTTP/1.0" in prev.split(b"\n", 1)[0],
    ),
]


def refuser(known: KnownDifference) -> Literal["refork", "h11"] | None:
    """Who refuses in this disagreement today (None: no disagreement today)."""
    refork_accepts = known.refork_accepts != known.pending
    if refork_accepts == known.h11_accepts:
        return None
    return "h11" if refork_accepts else "refork"


def explain(raw: bytes) -> tuple[Divergence | None, list[KnownDifference]]:
    """The first divergence on raw and the known differences that account for it."""
    found = divergence(refork_outcome(raw), h11_outcome(raw))
    if found is None or found.kind == "framing":
        return found, []
    prev, region = raw[found.prev_start : found.start], raw[found.start :]
    who = "refork" if found.kind == "refork refuses" else "h11"
    return found, [k for k in KNOWN_DIFFERENCES if refuser(k) == who and k.applies(prev, region)]
