"""PROXY protocol headers and the verdict on each, for both parsers: refork.http.proxy_protocol
(Python) and refork._native.parse_proxy (Rust). A row: (name, bytes, mode, expected) where expected
is "INCOMPLETE", "NOT_PROXY", "ERROR", or (protocol, length, client, server)."""

from __future__ import annotations

import struct

SIG = b"\r\n\r\n\x00\r\nQUIT\n"


def v2(command: int, family: int, body: bytes, version: int = 2, extra: int = 0) -> bytes:
    return SIG + bytes([version << 4 | command, family]) + struct.pack(">H", len(body) + extra) + body


IPV4 = bytes([192, 0, 2, 7, 10, 0, 0, 1]) + struct.pack(">HH", 51234, 443)
IPV6 = bytes(range(16)) + bytes(15) + b"\x01" + struct.pack(">HH", 40000, 8443)
V6_CLIENT = "1:203:405:607:809:a0b:c0d:e0f"
TLV = b"\x04\x00\x03abc"  # a TLV after the addresses (PP2_TYPE_NOOP): ignored

V1 = b"PROXY TCP4 192.0.2.7 10.0.0.1 51234 443\r\n"

VECTORS = [
    # v1
    ("v1 tcp4", V1 + b"GET / HTTP/1.1\r\n", "auto",
     ("TCP4", len(V1), ("192.0.2.7", 51234), ("10.0.0.1", 443))),
    ("v1 tcp4 in v1 mode", V1, "v1", ("TCP4", len(V1), ("192.0.2.7", 51234), ("10.0.0.1", 443))),
    ("v1 tcp6", b"PROXY TCP6 2001:db8::1 ::1 1 65535\r\n", "auto",
     ("TCP6", 36, ("2001:db8::1", 1), ("::1", 65535))),
    ("v1 unknown", b"PROXY UNKNOWN\r\n", "auto", ("UNKNOWN", 15, None, None)),
    ("v1 unknown with addresses", b"PROXY UNKNOWN ffff:f...f ffff:f...f 65535 65535\r\n", "auto",
     ("UNKNOWN", 49, None, None)),
    ("v1 first byte", b"P", "auto", "INCOMPLETE"),
    ("v1 prefix", b"PROXY", "v1", "INCOMPLETE"),
    ("v1 without its CRLF yet", V1[:-2], "auto", "INCOMPLETE"),
    ("v1 without its LF yet", V1[:-1], "auto", "INCOMPLETE"),
    ("v1 in v2 mode", V1, "v2", "NOT_PROXY"),
    ("v1 bad address", b"PROXY TCP4 192.0.2 10.0.0.1 1 2\r\n", "auto", "ERROR"),
    ("v1 v6 address for tcp4", b"PROXY TCP4 ::1 10.0.0.1 1 2\r\n", "auto", "ERROR"),
    ("v1 v4 address for tcp6", b"PROXY TCP6 10.0.0.2 ::1 1 2\r\n", "auto", "ERROR"),
    ("v1 leading zero", b"PROXY TCP4 192.0.2.07 10.0.0.1 1 2\r\n", "auto", "ERROR"),
    ("v1 port too big", b"PROXY TCP4 192.0.2.7 10.0.0.1 65536 2\r\n", "auto", "ERROR"),
    ("v1 signed port", b"PROXY TCP4 192.0.2.7 10.0.0.1 +1 2\r\n", "auto", "ERROR"),
    ("v1 missing field", b"PROXY TCP4 192.0.2.7 10.0.0.1 1\r\n", "auto", "ERROR"),
    ("v1 double space", b"PROXY TCP4  192.0.2.7 10.0.0.1 1 2\r\n", "auto", "ERROR"),
    ("v1 udp", b"PROXY UDP4 192.0.2.7 10.0.0.1 1 2\r\n", "auto", "ERROR"),
    ("v1 bare LF", b"PROXY TCP4 192.0.2.7 10.0.0.1 1 2\n", "auto", "ERROR"),
    ("v1 too long", b"PROXY UNKNOWN " + b"x" * 100, "auto", "ERROR"),
    ("v1 not ascii", b"PROXY TCP4 192.0.2.\xff 10.0.0.1 1 2\r\n", "auto", "ERROR"),
    # v2
    ("v2 tcp4", v2(1, 0x11, IPV4) + b"GET", "auto", ("TCP4", 28, ("192.0.2.7", 51234), ("10.0.0.1", 443))),
    ("v2 tcp6", v2(1, 0x21, IPV6), "v2", ("TCP6", 52, (V6_CLIENT, 40000), ("::1", 8443))),
    ("v2 tcp4 with a TLV", v2(1, 0x11, IPV4 + TLV), "auto",
     ("TCP4", 34, ("192.0.2.7", 51234), ("10.0.0.1", 443))),
    ("v2 local", v2(0, 0x00, b""), "auto", ("LOCAL", 16, None, None)),
    ("v2 local with addresses", v2(0, 0x11, IPV4), "auto", ("LOCAL", 28, None, None)),
    ("v2 unspec", v2(1, 0x00, b""), "auto", ("UNSPEC", 16, None, None)),
    ("v2 unix", v2(1, 0x31, bytes(216)), "auto", ("UNIX", 232, None, None)),
    ("v2 signature prefix", SIG[:5], "auto", "INCOMPLETE"),
    ("v2 signature only", SIG, "v2", "INCOMPLETE"),
    ("v2 addresses still coming", v2(1, 0x11, IPV4)[:20], "auto", "INCOMPLETE"),
    ("v2 length says more", v2(1, 0x11, IPV4, extra=10), "auto", "INCOMPLETE"),
    ("v2 in v1 mode", v2(1, 0x11, IPV4), "v1", "NOT_PROXY"),
    ("v2 version 1", v2(1, 0x11, IPV4, version=1), "auto", "ERROR"),
    ("v2 command 2", v2(2, 0x11, IPV4), "auto", "ERROR"),
    ("v2 udp", v2(1, 0x12, IPV4), "auto", "ERROR"),
    ("v2 short ipv4", v2(1, 0x11, IPV4[:8]), "auto", "ERROR"),
    ("v2 short ipv6", v2(1, 0x21, IPV6[:30]), "auto", "ERROR"),
    ("v2 family 4", v2(1, 0x41, IPV4), "auto", "ERROR"),
    # not PROXY at all
    ("http", b"GET / HTTP/1.1\r\n", "auto", "NOT_PROXY"),
    ("a method starting like PROXY", b"PROPFIND / HTTP/1.1\r\n", "auto", "NOT_PROXY"),
    ("PROXY as a method", b"PROXY/1.0", "auto", "NOT_PROXY"),
    ("tls", b"\x16\x03\x01\x02\x00\x01", "auto", "NOT_PROXY"),
    ("a CR first", b"\r\nGET", "auto", "NOT_PROXY"),
]
