"""refork._native.ResponseFramer (the ASGI loop's) against refork.http.response.ResponseFramer.

For any request, status, header list and sequence of body calls, both give the same bytes (the
Date line masked), raise the same error with the same message, and leave the same attributes;
and an ASGI response framed through ResponseState says the same to the app either way.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refork.asgi.response as asgi_response
from refork import _native
from refork.asgi.response import ResponseState
from refork.http.events import Request
from refork.http.response import ResponseFramer

ATTRIBUTES = ("keep_alive", "chunked", "content_length", "body_bytes", "no_body", "status", "http10")
DATE = re.compile(rb"Date: [^\r]*\r\n")

names = st.sampled_from([
    b"Content-Type", b"content-length", b"Content-Length", b"CONTENT-LENGTH", b"Transfer-Encoding",
    b"Keep-Alive", b"Connection", b"connection", b"Date", b"Server", b"server", b"X-A", b"x-b!#$%&'*+-.^_`|~",
    b"", b"bad name", b"bad:name", b"caf\xc3\xa9", b"Set-Cookie", b"transfer-encodinG",
])  # fmt: skip
values = st.one_of(
    st.sampled_from([b"", b"0", b"5", b"13", b"007", b"-1", b"+5", b" 5", b"5 ", b"1_0", b"close", b"Close",
                     b"keep-alive, close", b"keep-alive", b"x\r\ny", b"a\x00", b"tab\tok", b"del\x7f",
                     b"Tue, 14 Nov 2023 22:13:20 GMT", b"app/1"]),  # fmt: skip
    st.binary(max_size=6),
)
headers = st.lists(st.tuples(names, values), max_size=5)
statuses = st.sampled_from([200, 201, 204, 304, 100, 103, 199, 404, 500, 599, 999, 99, 1000, 299, 418])
steps = st.lists(st.tuples(st.sampled_from(["body", "last", "end"]), st.binary(max_size=20)), max_size=4)


def request(method: str, version: str, keep_alive: bool) -> Request:
    return Request(method, b"/", b"/", b"", version, [(b"host", b"h")], keep_alive)


def outcome(framer: Any, method: str, *args: Any) -> tuple[Any, ...]:
    """What framer.method(*args) gave (bytes, or the error's type and message), then its attributes."""
    try:
        got = getattr(framer, method)(*args)
    except Exception as exc:  # noqa: BLE001 (compared, type and message)
        result: Any = (type(exc).__name__, str(exc))
    else:
        result = DATE.sub(b"Date: *\r\n", got)
    return result, tuple(getattr(framer, name) for name in ATTRIBUTES)


def agree(python: ResponseFramer, native: _native.ResponseFramer, method: str, *args: Any) -> None:
    assert outcome(native, method, *args) == outcome(python, method, *args), (method, args)


@settings(max_examples=600, derandomize=True, database=None, deadline=None)
@given(st.sampled_from(["GET", "HEAD", "POST"]), st.sampled_from(["1.1", "1.0"]), st.booleans(),
       st.booleans(), statuses, headers, steps)  # fmt: skip
def test_the_native_framer_frames_as_the_python_one(
    method: str, version: str, keep_alive: bool, server_keep_alive: bool, status: int,
    fields: list[tuple[bytes, bytes]], calls: list[tuple[str, bytes]],
) -> None:  # fmt: skip
    req = request(method, version, keep_alive)
    python = ResponseFramer(req, server_keep_alive=server_keep_alive)
    native = _native.ResponseFramer(req, server_keep_alive=server_keep_alive)
    agree(python, native, "head", status, fields)
    for method, data in calls:
        agree(python, native, method, *([data] if method != "end" else []))


def test_the_head_is_refused_twice_and_odd_statuses_as_the_python_one() -> None:
    req = request("GET", "1.1", True)
    for status in (True, "200", None, -1):  # (not 200.0: Python's hits its line cache; ASGI refuses it first)
        agree(ResponseFramer(req), _native.ResponseFramer(req), "head", status, [])
    python, native = ResponseFramer(req), _native.ResponseFramer(req)
    python.head(200, [])
    native.head(200, [])
    agree(python, native, "head", 200, [])
    agree(ResponseFramer(req), _native.ResponseFramer(req), "head", 200, [], b"Fine")
    agree(ResponseFramer(req), _native.ResponseFramer(req), "head", 200, [], b"Bad\r\n")


# What an ASGI app may put in `headers` (the spec: an iterable of [name, value] two-item iterables).
HEADER_SHAPES = [
    [(b"content-length", b"2")],
    [[b"content-length", b"2"]],
    ((b"content-type", b"text/plain"),),
    "an iterator",  # [iter((b"x-a", b"1"))], made afresh for each run
    [(b"x-a", b"1", b"extra")],
    [(b"x-a",)],
    [("x-a", "1")],
    [(b"x-a", "1")],
    [b"ab"],
    ["ab"],
    [(bytearray(b"x-a"), b"1")],
    [(b"x a", b"1")],
    [(b"x-a", b"1\r\n")],
    [(b"content-length", b"x")],
    [(b"content-length", b"1"), (b"content-length", b"2")],
    [(b"content-length", b"99999999999999999999")],
    5,
    None,
]


@pytest.mark.parametrize("shape", HEADER_SHAPES, ids=range(len(HEADER_SHAPES)))
def test_an_asgi_response_says_the_same_with_either_framer(
    shape: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ResponseState (what send() raises, what it frames) with the native framer and the Python one."""

    def run() -> tuple[Any, ...]:
        state = ResponseState(request("GET", "1.1", True))
        fields = [iter((b"x-a", b"1"))] if shape == "an iterator" else shape
        try:
            out = state.feed({"type": "http.response.start", "status": 200, "headers": fields})
            out += state.feed({"type": "http.response.body", "body": b"ok"})
        except RuntimeError as exc:
            return ("RuntimeError", str(exc))
        return DATE.sub(b"Date: *\r\n", out), state.will_keep_alive, state.short_by

    native = run()
    monkeypatch.setattr(asgi_response, "Framer", ResponseFramer)
    python = run()
    if shape == [(b"content-length", b"99999999999999999999")]:
        # past 2**64: refused by the native framer, a too-short body (the connection closes) by Python's
        refused = "Invalid response head: invalid Content-Length b'99999999999999999999'"
        assert native == ("RuntimeError", refused)
        assert python[1:] == (False, 99999999999999999997)
        return
    assert native == python


def test_the_asgi_loop_frames_with_the_native_framer() -> None:
    assert asgi_response.Framer is _native.ResponseFramer
