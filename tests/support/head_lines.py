"""Request heads whose last line has not ended, under the default limits (8190 bytes for the
request line and for a field): the bytes, and what a server must do once they arrived: answer at
once (414, 431: the line is past its limit) or wait for the rest (None), then serve the request
when `rest` completes it. One table for the Python parser (tests/http/test_http_parser.py) and every
request path, the native engines' read path included (tests/promises/test_promises_memory.py).
"""

from __future__ import annotations

HEAD = b"GET / HTTP/1.1\r\nHost: x\r\n"
END = b" HTTP/1.1\r\nHost: x\r\n\r\n"

# (name, bytes sent, status at once or None, what completes it when None)
HEAD_LINES: list[tuple[str, bytes, int | None, bytes]] = [
    ("request-line-past-its-limit", b"GET /" + b"a" * 8200, 414, b""),
    ("request-line-within-its-limit", b"GET /" + b"a" * 8150, None, END),
    ("field-past-its-limit", HEAD + b"X-Long: " + b"v" * 8190, 431, b""),
    ("field-within-its-limit", HEAD + b"X-Long: " + b"v" * 8180, None, b"\r\n\r\n"),
    ("field-name-past-its-limit", HEAD + b"X" * 8200, 431, b""),
    ("many-fields-and-one-past-its-limit", HEAD + b"A: 1\r\n" * 50 + b"B: " + b"v" * 8200, 431, b""),
]
