"""What Rust reads of Python it reads typed, once (native/src/host.rs, http/request.rs, http/parser.rs):
the engines their host, settings, control, clock and refs when they are built; the native parser
its Python parser's state after each of its feeds; the Request class where it is given. A renamed
or mistyped field fails there, naming the field, not at a request; a call of many values takes
them typed or by name, so none can be given in another's place."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from support.harness import HarnessControl

from refork import _native
from refork.config import Config
from refork.http.events import Body, ParseError, Request
from refork.http.parser import Limits, RequestParser
from refork.http.rare import EOM
from refork.http.response import ResponseFramer
from refork.serving.parsers import native_parser
from refork.serving.settings import ServingSettings
from refork.serving.wsgi.engine_host import EngineHost
from refork.serving.wsgi.native_host import NativeHost
from refork.serving.wsgi.pool_host import PoolHost
from refork.wsgi.response import _Exchange


def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [b""]


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


# the control with request_started renamed, as a refactoring on the Python side would leave it
Renamed = type(
    "Renamed",
    (),
    {k: v for k, v in vars(HarnessControl).items() if k not in ("request_started", "__dict__", "__weakref__")}
    | {"request_begun": HarnessControl.request_started},
)


def causes(e: BaseException) -> str:
    """The messages of an error and its causes, one per line."""
    lines = []
    cause: BaseException | None = e
    while cause is not None:
        lines.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return "\n".join(lines)


def build(host_cls: type[NativeHost], sock: socket.socket, control: Any, **changed: Any) -> None:
    threads = 2 if host_cls is PoolHost else 1
    config = Config(app="tests:app", threads=threads, wsgi_loop="native")
    settings = dataclasses.replace(ServingSettings.for_worker(config, [sock]), **changed)
    host_cls([sock], app, config, control, settings)  # type: ignore[call-arg]


@pytest.mark.parametrize("host_cls", [EngineHost, PoolHost], ids=["engine", "pool"])
def test_a_renamed_or_mistyped_field_fails_when_the_engine_is_built(
    host_cls: type[NativeHost], listener: socket.socket
) -> None:
    build(host_cls, listener, HarnessControl())  # the right ones pass
    with pytest.raises(TypeError) as renamed:
        build(host_cls, listener, Renamed())
    assert "Host.control" in causes(renamed.value)
    assert "has no attribute 'request_started'" in causes(renamed.value)
    with pytest.raises(TypeError) as mistyped:
        build(host_cls, listener, HarnessControl(), accept_batch="8")
    assert "Host.settings" in causes(mistyped.value)
    assert "Settings.accept_batch" in causes(mistyped.value)


def test_a_mistyped_request_field_is_named() -> None:
    """Each native reader of a refork.http.events.Request reads its fields in one typed extraction."""
    request = Request("GET", b"/a", b"/a", b"", "1.1", [])
    with pytest.raises(TypeError) as framer:
        _native.ResponseFramer(dataclasses.replace(request, keep_alive="yes"))
    assert "FramedRequest.keep_alive" in causes(framer.value)
    with pytest.raises(TypeError) as scope:
        _native.http_scope(dataclasses.replace(request, path="/a"), server=None, client=None, scheme="http",
                           root_path="", state=None, proxies=None)  # fmt: skip
    assert "RequestLine.path" in causes(scope.value)


class MistypedParser(RequestParser):
    """A Python parser whose `buffered` says a str: the native parser reads its state typed."""

    __slots__ = ()

    @property
    def buffered(self) -> Any:
        return str(super().buffered)


def test_the_python_parser_behind_the_native_one_is_read_typed() -> None:
    """The native parser hands an unusual message to the Python parser and reads that parser's
    state once a feed, typed: a mistyped field fails at that feed, named; its refs are
    keyword-only, so no two can be swapped."""
    refs = _native.ParserRefs(python_parser=MistypedParser, request=Request, body=Body, end_of_message=EOM,
                              parse_error=ParseError)  # fmt: skip
    chunked = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    with pytest.raises(TypeError) as mistyped:
        _native.Parser(Limits(), refs).feed(chunked)
    assert "PythonParserState.buffered" in causes(mistyped.value)
    with pytest.raises(TypeError):
        _native.ParserRefs(RequestParser, Request, Body, EOM, ParseError)  # type: ignore[call-arg]
    parser = native_parser(Limits())
    assert parser.feed(chunked)[0].method == "POST"  # type: ignore[union-attr]
    assert (parser.in_message, parser.buffered, parser.head_held, parser.upgraded) == (True, 0, 0, None)


@dataclasses.dataclass(slots=True)
class Reordered:
    """refork.http.events.Request with two of its fields swapped."""

    method: str
    target: bytes
    path: bytes
    query: bytes
    http_version: str
    headers: list[tuple[bytes, bytes]] = dataclasses.field(default_factory=list)
    chunked: bool = False
    expect_continue: bool = False
    keep_alive: bool = True
    content_length: int | None = None


def test_a_request_class_with_its_fields_moved_fails_where_it_is_given() -> None:
    """The native code makes a Request from its fields in order: the class is checked where it is
    given (the parser's refs, at import; the engines' refs), naming the first field out of place."""
    with pytest.raises(TypeError) as moved:
        _native.ParserRefs(python_parser=RequestParser, request=Reordered, body=Body,  # type: ignore[arg-type]
                           end_of_message=EOM, parse_error=ParseError)  # fmt: skip
    assert "Request.keep_alive" in causes(moved.value)


def test_the_calls_with_many_arguments_take_typed_values() -> None:
    """frame_list reads the exchange and the framer typed (swapped, or a field mistyped, fails
    naming it); http_scope takes all but the request by name, Environ all its values."""
    request = Request("GET", b"/a", b"/a", b"", "1.1", [])
    framer = ResponseFramer(request)
    ex = _Exchange(framer, SimpleNamespace())  # type: ignore[arg-type]
    ex.start_response("200 OK", [])
    assert _native.frame_list(ex, framer, [b"ok"]) is not None
    with pytest.raises(AttributeError) as swapped:
        _native.frame_list(framer, ex, [b"ok"])  # type: ignore[arg-type]
    assert "'ResponseFramer' object has no attribute 'code'" in causes(swapped.value)
    ex.reason = "OK"  # type: ignore[assignment]
    with pytest.raises(TypeError) as mistyped:
        _native.frame_list(ex, framer, [b"ok"])
    assert "ExchangeStatus.reason" in causes(mistyped.value)
    with pytest.raises(TypeError):
        _native.http_scope(request, None, None, "http", "", None, None)  # type: ignore[misc]
    with pytest.raises(TypeError):
        _native.Environ({}, "", "http", "localhost", "80", print)  # type: ignore[misc]


class OldClock:
    """A worker's AppClock as it was before `use_engine_request`: the engine set `engine_request`."""

    engine_request = None

    def native_words(self) -> dict[str, Any]:
        return {}

    def adopt(self, began: float, method: str, path: bytes, blocking: bool = True) -> object:
        return None


class Clocked(HarnessControl):
    clock = OldClock()

    def requests_served(self, requests: int) -> int:
        return requests + 1


def test_the_engine_binds_what_it_calls_on_the_clock(listener: socket.socket) -> None:
    """The single-thread engine binds the clock's methods when it is built: a renamed one fails
    there, named, instead of the engine setting an attribute nothing reads."""
    with pytest.raises(AttributeError) as renamed:
        build(EngineHost, listener, Clocked())
    assert "has no attribute 'use_engine_request'" in causes(renamed.value)
