"""The WebSocket fast path (refork.http.websocket_frames), without sockets: whatever way the bytes
are cut, the messages and the frames left for wsproto are those of the stream, in order."""

from __future__ import annotations

import os

import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Message, Ping, TextMessage

from refork.http.websocket_frames import BIG, ForWsproto, FrameSplitter, server_frame


def client_frame(payload: bytes, opcode: int = 1, fin: bool = True, mask: bytes = b"\x01\x02\x03\x04",
                 length_bytes: int | None = None, masked: bool = True) -> bytes:  # fmt: skip
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    bit = 0x80 if masked else 0
    if length_bytes is None:
        length_bytes = 0 if n < 126 else 2 if n < 1 << 16 else 8
    if length_bytes == 0:
        head = bytes((first, bit | n))
    elif length_bytes == 2:
        head = bytes((first, bit | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((first, bit | 127)) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def through(chunks: list[bytes], max_size: int = 1 << 20) -> tuple[list, bytes]:
    splitter = FrameSplitter(max_size)
    messages, for_wsproto = [], b""
    for chunk in chunks:
        for item in splitter.feed(chunk):
            if type(item) is ForWsproto:
                for_wsproto += item
                messages.append(("wsproto", len(item)))
            else:
                messages.append(item)
    return messages, for_wsproto


STREAM = [
    client_frame("héllo".encode()),
    client_frame(b"\x00\xffbin", opcode=2),
    client_frame(b"x" * 300),  # 16-bit length
    client_frame(b"", opcode=1),
]


def cuts(data: bytes) -> list[list[bytes]]:
    every = [[data[i : i + 1] for i in range(len(data))]]
    halves = [[data[:i], data[i:]] for i in range(0, len(data) + 1, 7)]
    return [[data], *every, *halves]


@pytest.mark.parametrize("chunks", cuts(b"".join(STREAM)))
def test_whole_messages_are_read_here_however_the_bytes_are_cut(chunks):
    messages, rest = through(chunks)
    assert messages == ["héllo", b"\x00\xffbin", "x" * 300, ""] and rest == b""


def test_other_frames_go_to_wsproto_whole_and_in_order():
    ping = client_frame(b"p", opcode=9)
    first = client_frame(b"ab", opcode=1, fin=False)
    middle = client_frame(b"cd", opcode=0, fin=False)
    last = client_frame(b"ef", opcode=0, fin=True)
    data = client_frame(b"one") + ping + first + ping + middle + client_frame(b"no", opcode=1) + last
    data += client_frame(b"two")
    for chunks in cuts(data):
        splitter = FrameSplitter(1 << 20)
        out = [item for chunk in chunks for item in splitter.feed(chunk)]
        merged: list = []
        for item in out:  # how the pieces are grouped depends on the cuts; their bytes do not
            if type(item) is ForWsproto and merged and isinstance(merged[-1], bytearray):
                merged[-1] += item
            else:
                merged.append(bytearray(item) if type(item) is ForWsproto else item)
        assert merged == ["one", bytearray(ping + first + ping + middle + client_frame(b"no") + last), "two"]


@pytest.mark.parametrize(
    "frame",
    [
        client_frame(b"\xff\xfe"),  # invalid UTF-8: wsproto closes 1007
        client_frame(b"x", masked=False),  # unmasked: 1002
        bytes((0xC1, 0x81)) + b"\x00" * 4 + b"x",  # RSV1 without an extension: 1002
        client_frame(b"x", length_bytes=2),  # a length not minimally encoded
        client_frame(b"y" * 50, opcode=2),  # over the size limit below: the caller closes 1009
    ],
    ids=["utf8", "unmasked", "rsv1", "non-minimal", "too-big"],
)
def test_what_breaks_a_rule_is_wsproto_s_to_judge(frame):
    messages, rest = through([frame + client_frame(b"after")], max_size=40)
    assert messages[0] == ("wsproto", len(frame)) and rest == frame


def test_a_big_incomplete_frame_hands_everything_on_and_switches_off():
    big = client_frame(os.urandom(BIG + 10), opcode=2)
    splitter = FrameSplitter(1 << 20)
    assert splitter.feed(client_frame(b"a")) == ["a"]
    out = splitter.feed(big[:1000])
    assert out == [big[:1000]] and type(out[0]) is ForWsproto and not splitter.enabled


def test_wsproto_reads_what_the_splitter_passes_as_if_it_had_read_the_stream():
    """The pieces for wsproto are whole frames: it stays at a frame boundary between them."""
    data = b"".join([client_frame(b"one"), client_frame(b"p", opcode=9), client_frame(b"ab", fin=False),
                     client_frame(b"cd", opcode=0), client_frame(b"two"),
                     client_frame(b"\x03\xe8bye", opcode=8)])  # fmt: skip
    for chunks in cuts(data)[:40]:
        conn = Connection(ConnectionType.SERVER)
        splitter = FrameSplitter(1 << 20)
        seen: list = []
        for chunk in chunks:
            for item in splitter.feed(chunk):
                if type(item) is ForWsproto:
                    conn.receive_data(bytes(item))
                    for event in conn.events():
                        if isinstance(event, Message):
                            seen.append((event.data, event.message_finished))
                        elif isinstance(event, (Ping, CloseConnection)):
                            seen.append(type(event).__name__)
                else:
                    seen.append(item)
        assert seen == ["one", "Ping", ("ab", False), ("cd", True), "two", "CloseConnection"]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
def test_server_frames_are_the_ones_wsproto_builds(size):
    conn = Connection(ConnectionType.SERVER)
    text = "é" * (size // 2)
    data = os.urandom(size)
    assert server_frame(text) == conn.send(TextMessage(data=text))
    assert server_frame(data) == conn.send(BytesMessage(data=data))
