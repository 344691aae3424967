"""How the parser tests feed a RequestParser: whole or one byte per feed(), and the status of
a refusal."""

from __future__ import annotations

import pytest

from refork.http.events import ParseError
from refork.http.parser import Limits, RequestParser
from support.http_vectors import merge_bodies


def parse(raw: bytes, *, split: bool = False, limits: Limits = Limits()) -> list:
    """All events for raw, fed at once or one byte per feed(); Body pieces are merged."""
    parser = RequestParser(limits)
    if split:
        events = [e for i in range(len(raw)) for e in parser.feed(raw[i : i + 1])]
    else:
        events = parser.feed(raw)
    return merge_bodies(events)


def status_of(raw: bytes, *, split: bool = False, limits: Limits = Limits()) -> int:
    with pytest.raises(ParseError) as info:
        parse(raw, split=split, limits=limits)
    return info.value.status
