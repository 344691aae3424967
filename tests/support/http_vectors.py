"""What the HTTP parser tests share with the fuzzers and the native loop tests: the request
vectors and how a body split into events is merged back."""

from __future__ import annotations

from refork.http.events import Body, EndOfMessage, Event, Request

H = b"GET / HTTP/1.1\r\nHost: a\r\n"  # a valid head, still open for more fields
P = b"POST / HTTP/1.1\r\nHost: a\r\n"
TE = P + b"Transfer-Encoding: chunked\r\n"


def req(**kw) -> Request:
    base = dict(
        method="GET", target=b"/", path=b"/", query=b"", http_version="1.1", headers=[(b"host", b"a")]
    )
    base.update(kw)
    return Request(**base)


EOM = EndOfMessage()


def merge_bodies(events: list[Event]) -> list[Event]:
    """Adjacent Body events as one: how a body is cut into events is not framing."""
    merged: list[Event] = []
    for event in events:
        if isinstance(event, Body) and merged and isinstance(merged[-1], Body):
            merged[-1] = Body(merged[-1].data + event.data)
        else:
            merged.append(event)
    return merged


# (name, raw request, status): none of these may ever complete. Errors in the head never produce
# a Request; errors in a chunked body ("chunk-*", "trailer-*") come after the Request event, but
# never reach EndOfMessage, which is what the loops wait for before calling the app.
INVALID = [
    # Smuggling shapes: ambiguous or conflicting framing.
    ("cl-te", P + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("te-cl", P + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", 400),
    ("duplicate-cl-equal", P + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\na", 400),
    ("duplicate-cl-differ", P + b"Content-Length: 1\r\ncontent-length: 2\r\n\r\nab", 400),
    ("cl-list", P + b"Content-Length: 1, 1\r\n\r\na", 400),
    ("cl-plus", P + b"Content-Length: +1\r\n\r\na", 400),
    ("cl-negative", P + b"Content-Length: -1\r\n\r\n", 400),
    ("cl-inner-space", P + b"Content-Length: 1 1\r\n\r\na", 400),
    ("cl-hex", P + b"Content-Length: 0x1\r\n\r\na", 400),
    ("cl-empty", P + b"Content-Length: \r\n\r\n", 400),
    ("cl-overflow", P + b"Content-Length: 99999999999999999999999\r\n\r\n", 400),
    ("te-xchunked", P + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", 400),
    ("te-identity", P + b"Transfer-Encoding: identity\r\n\r\n", 400),
    ("te-chunked-identity", P + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
    ("te-chunked-twice", P + b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400),
    ("te-two-fields", TE + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("te-gzip-chunked", P + b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
    ("te-vtab", P + b"Transfer-Encoding: \x0bchunked\r\n\r\n0\r\n\r\n", 400),
    ("te-space-before-colon", P + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400),
    ("te-http10", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    # Chunked body syntax.
    ("chunk-size-overflow", TE + b"\r\nfffffffffffffffffff\r\nx\r\n0\r\n\r\n", 400),
    ("chunk-size-negative", TE + b"\r\n-5\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-size-0x", TE + b"\r\n0x5\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-size-space", TE + b"\r\n5 \r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-size-empty", TE + b"\r\n\r\n", 400),
    ("chunk-ext-ctl", TE + b"\r\n5;a=\x01\r\nhello\r\n0\r\n\r\n", 400),
    # The chunk-size lines refork.http.chunked reads (BWS around ; and =) stay as strict elsewhere.
    ("chunk-bws-no-semicolon", TE + b"\r\n5 ; a=b\r\nhello\r\n3 \r\nabc\r\n0\r\n\r\n", 400),
    ("chunk-bws-empty-ext", TE + b"\r\n5 ;\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-empty-value", TE + b"\r\n5 ; a =\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-bare-lf", TE + b"\r\n5 ; a=b\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-bare-cr", TE + b"\r\n5 ; a=b\rhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-cr-inside", TE + b"\r\n5 ; a=b\rc\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-obs-fold", TE + b"\r\n5 ; a=b\r\n c\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-unterminated-quote", TE + b'\r\n5 ; a="b\r\nhello\r\n0\r\n\r\n', 400),
    ("chunk-bws-ctl-in-quote", TE + b'\r\n5 ; a="\x01"\r\nhello\r\n0\r\n\r\n', 400),
    ("chunk-bws-space-in-name", TE + b"\r\n5 ; a b=c\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-space-in-value", TE + b"\r\n5 ; a=b c\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-overflow", TE + b"\r\n1ffffffffffffffff ; a\r\nx\r\n0\r\n\r\n", 400),
    ("chunk-bws-negative", TE + b"\r\n-5 ; a\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-0x", TE + b"\r\n0x5 ; a\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-bws-short-data", TE + b"\r\n5 ; a\r\nhell\r\n0\r\n\r\n", 400),
    ("chunk-bws-long-data", TE + b"\r\n5 ; a\r\nhello!\r\n0\r\n\r\n", 400),
    ("chunk-bws-data-bare-lf", TE + b"\r\n5 ; a\r\nhello\n0\r\n\r\n", 400),
    ("chunk-bws-then-bad-trailer", TE + b"\r\n5 ; a\r\nhello\r\n0 ; b\r\nX T: 1\r\n\r\n", 400),
    ("chunk-bws-then-forbidden-trailer", TE + b"\r\n0 ; b\r\nHost: x\r\n\r\n", 400),
    ("chunk-bws-then-obs-fold-trailer", TE + b"\r\n0 ; b\r\nX-T: 1\r\n c\r\n\r\n", 400),
    ("chunk-ext-empty", TE + b"\r\n5;\r\nhello\r\n0\r\n\r\n", 400),
    ("chunk-size-bare-lf", TE + b"\r\n5\nhello\r\n0\r\n\r\n", 400),
    ("chunk-data-no-crlf", TE + b"\r\n5\r\nhelloXX0\r\n\r\n", 400),
    ("trailer-bad-name", TE + b"\r\n0\r\nX T: 1\r\n\r\n", 400),
    ("trailer-nul", TE + b"\r\n0\r\nX-T: 1\x00\r\n\r\n", 400),
    ("trailer-obs-fold", TE + b"\r\n0\r\nX-T: 1\r\n b\r\n\r\n", 400),
    *(
        (f"trailer-forbidden-{n}", TE + b"\r\n0\r\n" + n.encode() + b": 1\r\n\r\n", 400)
        for n in (
            "Host",
            "Content-Length",
            "Transfer-Encoding",
            "Authorization",
            "Content-Type",
            "Trailer",
            "Range",
            "If-Match",
            "Cache-Control",
            "Connection",
            "Cookie",
            "Location",
            "Content-Encoding",
        )
    ),  # fmt: skip
    # Header syntax.
    ("obs-fold-space", H + b"X-A: a\r\n b\r\n\r\n", 400),
    ("obs-fold-tab", H + b"X-A: a\r\n\tb\r\n\r\n", 400),
    ("space-before-colon", H + b"X-A : a\r\n\r\n", 400),
    ("tab-before-colon", H + b"X-A\t: a\r\n\r\n", 400),
    ("name-not-token", H + b"X(A: a\r\n\r\n", 400),
    ("name-empty", H + b": a\r\n\r\n", 400),
    ("leading-space-field", H + b" X-A: a\r\n\r\n", 400),
    ("value-nul", H + b"X-A: a\x00b\r\n\r\n", 400),
    ("value-del", H + b"X-A: a\x7fb\r\n\r\n", 400),
    ("value-ctl", H + b"X-A: a\x01b\r\n\r\n", 400),
    ("value-bare-cr", H + b"X-A: a\rb\r\n\r\n", 400),
    # Line endings.
    ("bare-lf-everywhere", b"GET / HTTP/1.1\nHost: a\n\n", 400),
    ("bare-lf-after-field", b"GET / HTTP/1.1\r\nHost: a\n\r\n", 400),
    ("bare-lf-end-of-head", H + b"\n", 400),
    ("bare-cr-request-line", b"GET / HTTP/1.1\rHost: a\r\n\r\n", 400),
    # Request line.
    ("missing-host", b"GET / HTTP/1.1\r\n\r\n", 400),
    ("two-hosts", H + b"Host: b\r\n\r\n", 400),
    ("host-with-space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
    ("host-with-slash", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
    ("host-with-at", b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400),
    ("host-with-quote", b'GET / HTTP/1.1\r\nHost: a"b\r\n\r\n', 400),
    ("two-hosts-http10", b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    ("http20", b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    ("http09-versioned", b"GET / HTTP/0.9\r\nHost: a\r\n\r\n", 505),
    ("http09-simple", b"GET /\r\n\r\n", 505),
    ("http30", b"GET / HTTP/3.0\r\nHost: a\r\n\r\n", 505),
    ("h2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505),
    ("lowercase-version", b"GET / http/1.1\r\nHost: a\r\n\r\n", 400),
    ("version-trailing-space", b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n", 400),
    ("method-not-token", b"GE(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("http1-two-digit-minor", b"GET / HTTP/1.10\r\nHost: a\r\n\r\n", 400),
    ("asterisk-get", b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("asterisk-unknown-method", b"FOO * HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("absolute-form-userinfo", b"GET http://u@a/ HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("absolute-form-no-authority", b"GET http:///p HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("absolute-form-other-scheme", b"GET ftp://a/p HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("te-empty-elements-only", P + b"Transfer-Encoding: ,\r\n\r\n0\r\n\r\n", 400),
    ("tls-handshake", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 400),
    ("space-in-target", b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("ctl-in-target", b"GET /a\x01b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("tab-in-target", b"GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("non-ascii-target", b"GET /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("target-no-slash", b"GET x HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    ("connect", b"CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n", 501),
    ("upgrade-chunked", TE + b"Connection: upgrade\r\nUpgrade: h2c\r\n\r\n0\r\n\r\n", 400),
]


# (name, raw, expected events)
VALID = [
    ("simple-get", H + b"\r\n", [req(), EOM]),
    (
        "path-query",
        b"GET /a%20b/c?x=1&y=%2F HTTP/1.1\r\nHost: a\r\n\r\n",
        [req(target=b"/a%20b/c?x=1&y=%2F", path=b"/a%20b/c", query=b"x=1&y=%2F"), EOM],
    ),
    (
        "query-with-question",
        H.replace(b"/", b"/?a=1?b", 1) + b"\r\n",
        [req(target=b"/?a=1?b", query=b"a=1?b"), EOM],
    ),
    (
        "fragment-stripped",
        H.replace(b"/", b"/p?q#f", 1) + b"\r\n",
        [req(target=b"/p?q#f", path=b"/p", query=b"q"), EOM],
    ),
    (
        "absolute-form",
        b"GET http://x.com/p?q HTTP/1.1\r\nHost: x.com\r\n\r\n",
        [req(target=b"http://x.com/p?q", path=b"/p", query=b"q", headers=[(b"host", b"x.com")]), EOM],
    ),
    (  # RFC 9112 3.2.2: the target's authority wins over the Host field
        "absolute-form-host-from-target",
        b"GET https://t.example:8443/p#f HTTP/1.1\r\nHost: other\r\nX: 1\r\n\r\n",
        [
            req(
                target=b"https://t.example:8443/p#f",
                path=b"/p",
                headers=[(b"host", b"t.example:8443"), (b"x", b"1")],
            ),
            EOM,
        ],
    ),
    (
        "absolute-form-http10-without-host",
        b"GET http://t.example/p HTTP/1.0\r\n\r\n",
        [
            req(
                target=b"http://t.example/p",
                path=b"/p",
                http_version="1.0",
                keep_alive=False,
                headers=[(b"host", b"t.example")],
            ),
            EOM,
        ],
    ),  # fmt: skip
    ("http12-as-11", b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", [req()] + [EOM]),
    ("http19-as-11", b"GET / HTTP/1.9\r\nHost: a\r\n\r\n", [req(), EOM]),
    ("unknown-method", b"X-SYNC / HTTP/1.1\r\nHost: a\r\n\r\n", [req(method="X-SYNC"), EOM]),
    (
        "lowercase-method",
        b"get /?g HTTP/1.1\r\nHost: a\r\n\r\n",
        [req(method="get", target=b"/?g", query=b"g"), EOM],
    ),
    ("purge", b"PURGE / HTTP/1.1\r\nHost: a\r\n\r\n", [req(method="PURGE"), EOM]),
    (
        "unknown-method-with-body",
        b"XBREW /pot HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
        [
            req(
                method="XBREW",
                target=b"/pot",
                path=b"/pot",
                headers=[(b"host", b"a"), (b"content-length", b"3")],
                content_length=3,
            ),
            Body(b"abc"),
            EOM,
        ],
    ),
    (
        "te-empty-list-elements",
        P + b"Transfer-Encoding: , chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
        [
            req(method="POST", headers=[(b"host", b"a"), (b"transfer-encoding", b", chunked")], chunked=True),
            Body(b"hi"),
            EOM,
        ],
    ),
    (  # trailers are dropped: never in Request.headers
        "trailers-not-merged",
        TE + b"\r\n2\r\nhi\r\n0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n",
        [
            req(method="POST", headers=[(b"host", b"a"), (b"transfer-encoding", b"chunked")], chunked=True),
            Body(b"hi"),
            EOM,
        ],
    ),
    (
        "absolute-form-no-path",
        b"GET http://x.com?q HTTP/1.1\r\nHost: x.com\r\n\r\n",
        [req(target=b"http://x.com?q", path=b"/", query=b"q", headers=[(b"host", b"x.com")]), EOM],
    ),
    (
        "asterisk",
        b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
        [req(method="OPTIONS", target=b"*", path=b"*"), EOM],
    ),
    (
        "names-lowered-values-stripped",
        H + b"X-Thing:  v a l \t \r\nEmpty:\r\nUtf8: \xc3\xa9\r\nTab: a\tb\r\n\r\n",
        [
            req(
                headers=[
                    (b"host", b"a"),
                    (b"x-thing", b"v a l"),
                    (b"empty", b""),
                    (b"utf8", b"\xc3\xa9"),
                    (b"tab", b"a\tb"),
                ]
            ),
            EOM,
        ],
    ),
    (
        "content-length-body",
        P + b"Content-Length: 5\r\n\r\nhello",
        [
            req(method="POST", headers=[(b"host", b"a"), (b"content-length", b"5")], content_length=5),
            Body(b"hello"),
            EOM,
        ],
    ),
    (
        "content-length-ows",
        P + b"Content-Length:  05 \r\n\r\nhello",
        [
            req(method="POST", headers=[(b"host", b"a"), (b"content-length", b"05")], content_length=5),
            Body(b"hello"),
            EOM,
        ],
    ),
    (
        "content-length-zero",
        P + b"Content-Length: 0\r\n\r\n",
        [req(method="POST", headers=[(b"host", b"a"), (b"content-length", b"0")], content_length=0), EOM],
    ),
    (
        "chunked-ext-trailers",
        TE + b'\r\n5;a=b;c="d e"\r\nhello\r\n06\r\n world\r\n0;x\r\nX-Trailer: 1\r\nY: 2\r\n\r\n',
        [
            req(method="POST", headers=[(b"host", b"a"), (b"transfer-encoding", b"chunked")], chunked=True),
            Body(b"hello world"),
            EOM,
        ],
    ),
    (
        "chunked-case-and-ows",
        P + b"Transfer-Encoding:\tChunked \r\n\r\n0\r\n\r\n",
        [
            req(method="POST", headers=[(b"host", b"a"), (b"transfer-encoding", b"Chunked")], chunked=True),
            EOM,
        ],
    ),
    (
        "host-forms",
        b"GET / HTTP/1.1\r\nHost: [::1]:8000\r\n\r\nGET / HTTP/1.1\r\nHost: \r\n\r\n",
        [req(headers=[(b"host", b"[::1]:8000")]), EOM, req(headers=[(b"host", b"")]), EOM],
    ),
    ("leading-crlf", b"\r\n" + H + b"\r\n", [req(), EOM]),
    (
        "http10-no-host",
        b"GET / HTTP/1.0\r\n\r\n",
        [req(http_version="1.0", headers=[], keep_alive=False), EOM],
    ),
    (
        "http10-keep-alive",
        b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
        [req(http_version="1.0", headers=[(b"connection", b"Keep-Alive")], keep_alive=True), EOM],
    ),
    (
        "http10-keep-alive-and-close",
        b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n",
        [req(http_version="1.0", headers=[(b"connection", b"keep-alive, close")], keep_alive=False), EOM],
    ),
    (
        "http11-close",
        H + b"Connection: foo, CLOSE\r\n\r\n",
        [req(headers=[(b"host", b"a"), (b"connection", b"foo, CLOSE")], keep_alive=False), EOM],
    ),
    (
        "http11-close-in-second-field",
        H + b"Connection: keep-alive\r\nConnection: close\r\n\r\n",
        [
            req(
                headers=[(b"host", b"a"), (b"connection", b"keep-alive"), (b"connection", b"close")],
                keep_alive=False,
            ),
            EOM,
        ],
    ),
    (
        "expect-continue",
        P + b"Content-Length: 2\r\nExpect: 100-Continue\r\n\r\nab",
        [
            req(
                method="POST",
                headers=[(b"host", b"a"), (b"content-length", b"2"), (b"expect", b"100-Continue")],
                content_length=2,
                expect_continue=True,
            ),
            Body(b"ab"),
            EOM,
        ],
    ),
    (
        "expect-continue-no-body",
        H + b"Expect: 100-continue\r\n\r\n",
        [req(headers=[(b"host", b"a"), (b"expect", b"100-continue")]), EOM],
    ),
    (
        "expect-continue-http10-ignored",
        b"POST / HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\nx",
        [
            req(
                method="POST",
                http_version="1.0",
                headers=[(b"content-length", b"1"), (b"expect", b"100-continue")],
                keep_alive=False,
                content_length=1,
            ),
            Body(b"x"),
            EOM,
        ],
    ),
    (
        "upgrade-ignored-then-pipelined",
        H + b"Connection: Upgrade\r\nUpgrade: websocket\r\n\r\n" + H + b"\r\n",
        [
            req(headers=[(b"host", b"a"), (b"connection", b"Upgrade"), (b"upgrade", b"websocket")]),
            EOM,
            req(),
            EOM,
        ],
    ),
    (
        # llhttp would hand the body to the "new protocol"; we read it as the body it is.
        "upgrade-with-body-not-smuggled",
        P + b"Connection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 27\r\n\r\n" + H + b"\r\n",
        [
            req(
                method="POST",
                headers=[
                    (b"host", b"a"),
                    (b"connection", b"Upgrade"),
                    (b"upgrade", b"h2c"),
                    (b"content-length", b"27"),
                ],
                content_length=27,
            ),
            Body(H + b"\r\n"),
            EOM,
        ],
    ),
]
