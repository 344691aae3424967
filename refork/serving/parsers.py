"""The request parser a connection gets: refork._native.Parser where the extension is built, else
refork.http.parser.RequestParser.

The native parser reads the common shape of a head with httparse and hands any other message (an
unusual method or target, chunked, Expect, Upgrade, a head split across reads, an error) from its
first byte to the Python parser, so every rejection, limit and status is the Python parser's by
construction (held to it by tests/serving/test_native_loop.py). A request costs one call instead
of one Python call per llhttp callback.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from refork.http.events import Body, ParseError, Request
from refork.http.parser import Limits, RequestParser
from refork.http.rare import EOM

try:
    from refork import _native  # typed by refork/_native.pyi
except ImportError:  # not built: the Python parser serves alone
    _native = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from typing import TypeAlias

    # RequestParser's contract: feed(), release(), in_message, buffered, head_held, upgraded
    AnyRequestParser: TypeAlias = RequestParser | _native.Parser


def _refs(python_parser: Callable[[Limits], RequestParser]) -> _native.ParserRefs:
    return _native.ParserRefs(python_parser=python_parser, request=Request, body=Body, end_of_message=EOM,
                              parse_error=ParseError)  # fmt: skip


# what a native parser makes its events with; the second's Python parser hands a WebSocket off
_REFS, _HAND_OFF_REFS = (None, None) if _native is None else (
    _refs(RequestParser), _refs(partial(RequestParser, hand_off_websocket=True))
)  # fmt: skip


def native_parser(limits: Limits, *, hand_off_websocket: bool = False) -> _native.Parser:
    """A refork._native.Parser (the extension must be built). With ``hand_off_websocket`` its Python
    parser stops after a WebSocket handshake and keeps the bytes after it (``upgraded``)."""
    refs = _HAND_OFF_REFS if hand_off_websocket else _REFS
    assert refs is not None, "refork._native is not built"
    return _native.Parser(limits, refs)


def request_parser(limits: Limits, *, hand_off_websocket: bool = False) -> AnyRequestParser:
    """The native parser where the extension is built, else the Python one (the same contract)."""
    if _native is None:
        return RequestParser(limits, hand_off_websocket=hand_off_websocket)
    return native_parser(limits, hand_off_websocket=hand_off_websocket)
