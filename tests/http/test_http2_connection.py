"""refork.http.h2 without sockets: an h2 client (or hand-built frames) on one side, the sans-IO
server connection on the other; requests, flow control, limits and each known attack."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import hpack
import pytest
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

from refork.http.h2 import (
    ANY_STREAM,
    GOAWAY_WAIT,
    PREFACE,
    ConnectionEnded,
    ErrorCodes,
    Http2Connection,
    Http2Limits,
    StreamBody,
    StreamEnded,
    StreamOpened,
    StreamReset,
)

GET = [(b":method", b"GET"), (b":path", b"/a?x=1"), (b":scheme", b"http"), (b":authority", b"example.com")]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def connect(clock: Clock | None = None, **limits):
    """A server connection and an h2 client past the preface and the SETTINGS exchange."""
    server = Http2Connection(Http2Limits(**limits), clock or Clock())
    server.start()
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    assert server.receive(client.data_to_send()) == [] or True
    client.receive_data(server.data_to_send())
    server.receive(client.data_to_send())
    client.receive_data(server.data_to_send())
    return server, client


def to_server(server, client):
    return server.receive(client.data_to_send())


def to_client(server, client):
    return client.receive_data(server.data_to_send())


def send_body(client, sid, n):
    while n:
        chunk = min(n, 16384)
        client.send_data(sid, b"x" * chunk)
        n -= chunk


def raw(server, *frames):
    """Frames from a client that does not play by the rules, past a valid preface."""
    return server.receive(b"".join(f.serialize() for f in frames))


def goaway_code(server) -> int | None:
    """The error code of the GOAWAY the server sent (whatever came before it on the wire)."""
    for frame in _frames(server.data_to_send()):
        if isinstance(frame, GoAwayFrame):
            return int(frame.error_code)
    return None


def ended(events) -> ConnectionEnded:
    (end,) = [e for e in events if isinstance(e, ConnectionEnded)]
    return end


def test_a_request_and_its_response():
    server, client = connect()
    client.send_headers(1, [*GET, (b"user-agent", b"t")], end_stream=True)
    opened, end = to_server(server, client)
    assert isinstance(opened, StreamOpened) and opened.stream_id == 1 and opened.ended and not opened.refused
    request = opened.request
    assert (request.method, request.path, request.query) == ("GET", b"/a", b"x=1")
    assert request.http_version == "2.0"  # the access log's HTTP/2.0; the ASGI scope says "2"
    assert request.headers == [(b"host", b"example.com"), (b"user-agent", b"t")]
    assert end == StreamEnded(1)
    server.respond(1, 200, [(b"Content-Type", b"text/plain"), (b"Connection", b"close")], end_stream=False)
    assert server.send_body(1, memoryview(b"hello"), end_stream=True) == 5
    events = to_client(server, client)
    (response,) = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
    assert response.headers == [(b":status", b"200"), (b"content-type", b"text/plain")]
    assert b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived)) == b"hello"
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)
    assert server.open_streams == 0


def test_request_body_is_flow_controlled_by_what_the_app_takes():
    server, client = connect(initial_window_size=65535)
    client.send_headers(1, [(b":method", b"POST"), *GET[1:]])
    to_server(server, client)
    assert client.local_flow_control_window(1) == 65535
    send_body(client, 1, 65535)
    got = to_server(server, client)
    assert sum(len(e.data) for e in got if isinstance(e, StreamBody)) == 65535
    to_client(server, client)
    assert client.local_flow_control_window(1) == 0  # the app took nothing: the stream waits
    server.body_consumed(1, 1000)
    to_client(server, client)
    assert client.local_flow_control_window(1) == 1000


def test_a_stream_that_does_not_read_leaves_the_others_their_window():
    server, client = connect(initial_window_size=65535)
    for sid in (1, 3):
        client.send_headers(sid, [(b":method", b"POST"), *GET[1:]])
    send_body(client, 1, 65535)
    to_server(server, client)
    to_client(server, client)
    assert client.local_flow_control_window(3) == 65535  # the connection's window was given back


def test_body_limit_by_content_length_and_while_streaming():
    server, client = connect(max_body=10)
    client.send_headers(1, [(b":method", b"POST"), *GET[1:], (b"content-length", b"11")])
    (opened,) = to_server(server, client)
    assert opened.refused == 413
    client.send_headers(3, [(b":method", b"POST"), *GET[1:]])
    client.send_data(3, b"x" * 8)
    client.send_data(3, b"x" * 8)
    events = to_server(server, client)
    assert StreamReset(3, ErrorCodes.CANCEL, by_client=False) in events
    resets = [e for e in to_client(server, client) if isinstance(e, h2.events.StreamReset)]
    assert [r.stream_id for r in resets] == [3]


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([(b"x-h%d" % i, b"v") for i in range(101)], 431),
        ([(b"x-big", b"v" * 9000)], 431),
        ([(b":method", b"GET"), (b":path", b"/" + b"p" * 9000), (b":scheme", b"http"), (b"host", b"h")], 414),
    ],
)
def test_header_limits_refuse_the_stream(headers, status):
    server, client = connect()
    block = headers if headers[0][0] == b":method" else [*GET, *headers]
    client.send_headers(1, block, end_stream=True)
    opened = to_server(server, client)[0]
    assert opened.refused == status


def test_rapid_reset_budget_then_goaway():
    clock = Clock()
    server, client = connect(clock, resets=(20, 1.0))
    for i in range(25):
        sid = 1 + 2 * i
        client.send_headers(sid, GET, end_stream=True)
        client.reset_stream(sid)
    events = to_server(server, client)
    end = ended(events)
    assert end.code == ErrorCodes.ENHANCE_YOUR_CALM and "Rapid Reset" in end.reason
    assert goaway_code(server) == ErrorCodes.ENHANCE_YOUR_CALM
    assert server.receive(b"more") == []  # nothing is read after it


@pytest.mark.parametrize(
    "violation",
    [lambda sid: DataFrame(sid, data=b"x"), lambda sid: WindowUpdateFrame(sid, window_increment=2**31 - 1)],
    ids=["data-on-closed-stream", "window-overflow"],
)
def test_made_you_reset_shares_the_reset_budget(violation):
    """Stream errors the client provokes make refork reset its streams: the same budget."""
    server, _ = connect(resets=(20, 1.0))
    enc = hpack.Encoder()
    frames = []
    for i in range(40):
        sid = 1 + 2 * i
        frames += [HeadersFrame(sid, data=enc.encode(GET), flags=["END_HEADERS", "END_STREAM"]),
                   violation(sid), violation(sid)]  # fmt: skip
    end = ended(raw(server, *frames))
    assert end.code == ErrorCodes.ENHANCE_YOUR_CALM and "MadeYouReset" in end.reason


def test_resets_within_the_budget_refill_with_time():
    clock = Clock()
    server, client = connect(clock, resets=(5, 1.0))
    for round_ in range(4):
        for i in range(4):
            sid = 1 + 2 * (round_ * 4 + i)
            client.send_headers(sid, GET, end_stream=True)
            client.reset_stream(sid)
        assert not [e for e in to_server(server, client) if isinstance(e, ConnectionEnded)]
        clock.now += 10


def test_continuation_flood_is_cut_while_the_block_arrives():
    server, _ = connect(max_header_list_size=16384)
    enc = hpack.Encoder()
    first = HeadersFrame(1, data=enc.encode(GET))
    frames = [first] + [ContinuationFrame(1, data=b"\x00" * 16000) for _ in range(5)]
    end = ended(raw(server, *frames))
    assert end.code == ErrorCodes.ENHANCE_YOUR_CALM
    assert server.buffered == 0  # nothing of it is kept


def test_hpack_bomb_is_cut_while_decoding():
    server, _ = connect(max_header_list_size=65536)
    block = hpack.Encoder().encode([*GET] + [(b"x-bomb", b"a" * 4000)] * 40)  # ~4 KB encoded, 160 KB decoded
    assert len(block) < 8000
    end = ended(raw(server, HeadersFrame(1, data=block, flags=["END_HEADERS", "END_STREAM"])))
    assert end.code in (ErrorCodes.ENHANCE_YOUR_CALM, ErrorCodes.PROTOCOL_ERROR)
    assert goaway_code(server) == end.code


@pytest.mark.parametrize(
    ("frame", "budget"),
    [
        (lambda: SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 70000}), "settings"),
        (lambda: PingFrame(0, opaque_data=b"12345678"), "pings"),
        (lambda: WindowUpdateFrame(0, window_increment=1), "window_updates"),
        (lambda: PriorityFrame(1, depends_on=0, stream_weight=16), "priorities"),
    ],
)
def test_control_frame_floods_get_goaway(frame, budget):
    server, _ = connect(**{budget: (30, 1.0)})
    events = raw(server, *[frame() for _ in range(40)])
    assert ended(events).code == ErrorCodes.ENHANCE_YOUR_CALM
    assert goaway_code(server) == ErrorCodes.ENHANCE_YOUR_CALM


def test_a_few_control_frames_are_fine():
    server, _ = connect()
    events = raw(server, *[PingFrame(0, opaque_data=b"12345678") for _ in range(10)])
    assert not [e for e in events if isinstance(e, ConnectionEnded)]
    assert server.data_to_send().count(b"12345678") == 10  # each answered


def test_an_oversized_frame_is_refused_from_its_header():
    server, _ = connect(max_frame_size=16384)
    header = (1 << 20).to_bytes(3, "big") + b"\x00\x04\x00\x00\x00\x01"  # DATA, 1 MiB announced
    end = ended(server.receive(header))
    assert end.code == ErrorCodes.FRAME_SIZE_ERROR


def test_a_stream_beyond_the_limit_is_refused_and_the_others_go_on():
    server, _ = connect(max_concurrent_streams=2)
    enc = hpack.Encoder()
    # stream 5 is refused; its header block still feeds HPACK's table, which stream 7 refers to
    frames = [HeadersFrame(sid, data=enc.encode([*GET, ("x-n", str(sid))]), flags=["END_HEADERS"])
              for sid in (1, 3, 5)]  # fmt: skip
    events = raw(server, *frames, DataFrame(5, data=b"in flight", flags=["END_STREAM"]))
    assert [e.stream_id for e in events if isinstance(e, StreamOpened)] == [1, 3]
    assert not any(isinstance(e, ConnectionEnded) for e in events)
    refused = [f for f in _frames(server.data_to_send()) if isinstance(f, RstStreamFrame)]
    assert [(f.stream_id, f.error_code) for f in refused][:1] == [(5, ErrorCodes.REFUSED_STREAM)]
    server.respond(1, 204, [], end_stream=True)
    raw(server, DataFrame(1, flags=["END_STREAM"]))
    events = raw(server, HeadersFrame(7, data=enc.encode([*GET, ("x-n", "7")]), flags=["END_HEADERS"]))
    (opened,) = [e for e in events if isinstance(e, StreamOpened)]
    assert (opened.stream_id, opened.request.headers[-1]) == (7, (b"x-n", b"7"))


def test_opening_streams_past_the_limit_in_a_loop_ends_in_goaway():
    server, _ = connect(max_concurrent_streams=1)
    enc = hpack.Encoder()
    frames = [HeadersFrame(sid, data=enc.encode(GET), flags=["END_HEADERS"]) for sid in range(1, 1001, 2)]
    assert ended(raw(server, *frames)).code == ErrorCodes.ENHANCE_YOUR_CALM


def _goaways_and_pings(server) -> list[tuple[str, int]]:
    """What the server sent of a graceful end: ("GOAWAY", last stream id) and ("PING", 0) in order."""
    out = []
    for f in _frames(server.data_to_send()):
        if isinstance(f, GoAwayFrame):
            assert f.error_code == ErrorCodes.NO_ERROR
            out.append(("GOAWAY", f.last_stream_id))
        elif isinstance(f, PingFrame) and "ACK" not in f.flags:
            out.append(("PING", 0))
    return out


def _ping_ack(server, data: bytes) -> list:
    """The client acknowledges a PING whose opaque data was `data`."""
    return raw(server, PingFrame(0, opaque_data=data, flags=["ACK"]))


def _head(sid: int) -> HeadersFrame:
    return HeadersFrame(sid, data=hpack.Encoder().encode(GET), flags=["END_HEADERS", "END_STREAM"])


def _refused(server) -> set[int]:
    return {f.stream_id for f in _frames(server.data_to_send())
            if isinstance(f, RstStreamFrame) and f.error_code == ErrorCodes.REFUSED_STREAM}  # fmt: skip


def _start_graceful_end(server) -> bytes:
    """goaway(): its first GOAWAY (ANY_STREAM) and a PING; the PING's opaque data."""
    server.goaway()
    out = server.data_to_send()
    frames = list(_frames(out))
    assert [(type(f).__name__, getattr(f, "last_stream_id", 0)) for f in frames] == [
        ("GoAwayFrame", ANY_STREAM), ("PingFrame", 0)]  # fmt: skip
    assert frames[0].error_code == ErrorCodes.NO_ERROR and ANY_STREAM == 2**31 - 1
    return frames[1].opaque_data


def test_graceful_goaway_takes_every_stream_until_the_ping_ack_then_names_the_last():
    server, client = connect()
    client.send_headers(1, GET, end_stream=True)
    to_server(server, client)
    ping = _start_graceful_end(server)
    # streams the client sent before it read the first GOAWAY are still taken
    opened = [e for e in raw(server, _head(3), _head(5)) if isinstance(e, StreamOpened)]
    assert [(e.stream_id, e.refused) for e in opened] == [(3, 0), (5, 0)]
    assert _goaways_and_pings(server) == []
    assert not [e for e in _ping_ack(server, b"other\0\0\0") if isinstance(e, ConnectionEnded)]
    assert _goaways_and_pings(server) == []  # (the ACK of another PING: not this round trip)
    # the ACK: the final GOAWAY names the last stream taken; one sent after it is refused
    events = [*_ping_ack(server, ping), *raw(server, _head(7))]
    assert not [e for e in events if isinstance(e, StreamOpened)]
    out = server.data_to_send()
    frames = list(_frames(out))
    goaway = [f for f in frames if isinstance(f, GoAwayFrame)]
    assert [(f.error_code, f.last_stream_id) for f in goaway] == [(ErrorCodes.NO_ERROR, 5)]
    assert [(f.stream_id, f.error_code) for f in frames if isinstance(f, RstStreamFrame)] == [
        (7, ErrorCodes.REFUSED_STREAM)]  # fmt: skip
    # the streams named are still answered, and nothing more goes out after the final GOAWAY
    for sid in (1, 3, 5):
        server.respond(sid, 204, [], end_stream=True)
    answered = {f.stream_id for f in _frames(server.data_to_send()) if isinstance(f, HeadersFrame)}
    assert answered == {1, 3, 5}
    _ping_ack(server, ping)
    server.tick()
    assert _goaways_and_pings(server) == [] and not server.ended


def test_graceful_goaway_without_the_ping_ack_ends_after_goaway_wait():
    clock = Clock()
    server, client = connect(clock)
    _start_graceful_end(server)
    clock.now += GOAWAY_WAIT / 2
    server.tick()
    assert [e.stream_id for e in raw(server, _head(1)) if isinstance(e, StreamOpened)] == [1]
    assert _goaways_and_pings(server) == []
    clock.now += GOAWAY_WAIT / 2
    server.tick()
    assert _goaways_and_pings(server) == [("GOAWAY", 1)]
    raw(server, _head(3))
    assert _refused(server) == {3}
    server.goaway()  # (once only)
    server.tick()
    assert _goaways_and_pings(server) == []


def test_a_connection_error_while_going_away_gets_one_goaway_at_once():
    server, client = connect()
    ping = _start_graceful_end(server)
    raw(server, _head(1))
    end = ended(raw(server, WindowUpdateFrame(0, window_increment=0)))  # a protocol error
    assert end.code == ErrorCodes.PROTOCOL_ERROR
    (goaway,) = [f for f in _frames(server.data_to_send()) if isinstance(f, GoAwayFrame)]
    assert (goaway.error_code, goaway.last_stream_id) == (ErrorCodes.PROTOCOL_ERROR, 1)
    server.tick()
    _ping_ack(server, ping)
    assert server.data_to_send() == b""  # (no graceful GOAWAY after it)


def test_client_goaway_and_reset_are_events():
    server, client = connect()
    client.send_headers(1, GET)
    to_server(server, client)
    client.reset_stream(1, error_code=8)
    assert to_server(server, client) == [StreamReset(1, 8)]
    events = raw(server, GoAwayFrame(0, last_stream_id=0, error_code=0))
    assert ended(events).by_client


def test_a_bad_preface_ends_the_connection():
    server = Http2Connection(Http2Limits())
    server.start()
    end = ended(server.receive(b"GET / HTTP/1.1\r\n\r\n"))
    assert end.code == ErrorCodes.PROTOCOL_ERROR
    assert PREFACE.startswith(b"PRI")


def _frames(data: bytes):
    from hyperframe.frame import Frame

    while data:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9:9 + length]))
        yield frame
        data = data[9 + length:]


def test_a_path_that_is_no_uri_resets_its_stream_and_the_connection_goes_on():
    """A raw '"' in the query is no valid :path (RFC 3986; HTTP/1.1 takes it, as gunicorn does):
    the stream is reset PROTOCOL_ERROR (RFC 9113 8.1.1, a malformed request) without the app, and
    the connection's next request is served."""
    server, client = connect()
    bad = [(b":method", b"GET"), (b":path", b'/q?b="x"'), (b":scheme", b"http"), (b":authority", b"x")]
    client.send_headers(1, bad, end_stream=True)
    assert not [e for e in to_server(server, client) if isinstance(e, StreamOpened)]
    resets = [e for e in to_client(server, client) if isinstance(e, h2.events.StreamReset)]
    assert [(e.stream_id, e.error_code) for e in resets] == [(1, ErrorCodes.PROTOCOL_ERROR)]
    client.send_headers(3, GET, end_stream=True)
    opened = [e for e in to_server(server, client) if isinstance(e, StreamOpened)]
    assert [e.stream_id for e in opened] == [3]
