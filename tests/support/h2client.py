"""A synchronous HTTP/2 client for the promise matrix: requests on streams of one connection, each
answer read as it comes (python-hyper's `h2` for the protocol); cleartext with prior knowledge
(h2c), or over TLS with a context offering ALPN h2.

What it may retry is what RFC 9113 8.7 says the server did not process: a stream above the last
stream id of the server's GOAWAY, or one reset with REFUSED_STREAM (`Refused`). A connection that
ends under a stream the server took is that request lost (`ConnectionError`).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator, Sequence

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
from h2.connection import ConnectionState
from h2.errors import ErrorCodes
from hyperframe.frame import Frame, HeadersFrame, SettingsFrame

from support.sockets import hang_up

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
Fields = Sequence[tuple[str, str] | tuple[bytes, bytes]]  # a request's header fields (name, value)


class Refused(Exception):
    """The server did not process this stream (GOAWAY below it, REFUSED_STREAM): send it again."""


def connect(port: int, timeout: float, tls: ssl.SSLContext | None = None) -> socket.socket:
    """A connection for HTTP/2: cleartext, or TLS (handshake done) whose ALPN must have picked h2."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if tls is None:
        return sock
    wrapped = tls.wrap_socket(sock, server_hostname="127.0.0.1")
    if wrapped.selected_alpn_protocol() != "h2":
        wrapped.close()
        raise ConnectionError(f"ALPN picked {wrapped.selected_alpn_protocol()!r}, not h2")
    return wrapped


class H2Client:
    """One HTTP/2 connection (over TLS with `tls`). `settings` are sent with the preface (say
    INITIAL_WINDOW_SIZE 0). `sock`: a connection the caller made instead of one to `port` (from an
    address of its choosing, a PROXY header sent on it; over TLS, ALPN h2), that the preface follows."""

    def __init__(self, port: int, timeout: float = 30.0, settings: dict[int, int] | None = None,
                 tls: ssl.SSLContext | None = None, sock: socket.socket | None = None) -> None:  # fmt: skip
        self.sock = sock if sock is not None else connect(port, timeout, tls)
        self.scheme = "https" if isinstance(self.sock, ssl.SSLSocket) else "http"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.goaway: int | None = None  # the last stream id of the server's GOAWAY
        self.closed = False
        self.answers: dict[int, tuple[int, bytearray, bool]] = {}  # sid -> (status, body, ended)
        self.resets: dict[int, int] = {}  # sid -> error code
        self.heads: dict[int, dict[bytes, bytes]] = {}  # sid -> the final response's header fields
        self.unparsed = b""  # the start of a frame not whole yet
        self.flush()

    @property
    def usable(self) -> bool:
        """A new stream may go on this connection (no GOAWAY, not closed)."""
        return self.goaway is None and not self.closed

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.sock.sendall(data)

    def send(self, method: str, path: str, body: bytes = b"", length: int | None = None,
             fields: Fields = ()) -> int:  # fmt: skip
        """Open a stream with this request (`fields` after the pseudo-headers) and return its id:
        its whole body (when the window lets it), or with `length` a Content-Length and no body yet
        (send_data sends it)."""
        sid = self.conn.get_next_available_stream_id()
        head: list[tuple[str, str] | tuple[bytes, bytes]] = [
            (":method", method), (":path", path), (":scheme", self.scheme), (":authority", "127.0.0.1"),
            *fields,
        ]  # fmt: skip
        if body or length is not None:
            head.append(("content-length", str(len(body) if length is None else length)))
        self.conn.send_headers(sid, head, end_stream=not body and length is None)
        self.answers[sid] = (0, bytearray(), False)
        if body:
            self.send_data(sid, body, end=True)
        self.flush()
        return sid

    def send_data(self, sid: int, data: bytes, end: bool = False) -> int:
        """As much of `data` as the stream's window takes now; how much that was."""
        size = min(len(data), self.conn.local_flow_control_window(sid))
        sent = 0
        while sent < size:
            n = min(size - sent, self.conn.max_outbound_frame_size)
            self.conn.send_data(sid, data[sent : sent + n], end_stream=end and sent + n == len(data))
            sent += n
        if end and not data:
            self.conn.end_stream(sid)
        self.flush()
        return sent

    def read(self) -> bool:
        """One read's events handled; False when the connection is closed."""
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.closed = True
            return False
        data = self.unparsed + data
        while len(data) >= 9 and len(data) >= (end := 9 + int.from_bytes(data[:3], "big")):
            # one frame at a time: a GOAWAY's event is handled before the frames after it
            for event in self.conn.receive_data(data[:end]):
                self._handle(event)
            data = data[end:]
        self.unparsed = data
        try:
            self.flush()
        except OSError:
            self.closed = True
        return True

    def _handle(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", None)
        if isinstance(event, h2.events.ResponseReceived):
            status = int(dict(event.headers)[b":status"])
            if status >= 200:
                self.answers[sid] = (status, self.answers[sid][1], False)
                self.heads[sid] = dict(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self.answers[sid][1].extend(event.data)
            self.conn.acknowledge_received_data(event.flow_controlled_length, sid)
        elif isinstance(event, h2.events.StreamEnded):
            status, body, _ = self.answers[sid]
            self.answers[sid] = (status, body, True)
        elif isinstance(event, h2.events.StreamReset):
            self.resets[sid] = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event.last_stream_id if event.last_stream_id is not None else 0
            if event.error_code == ErrorCodes.NO_ERROR:
                # RFC 9113 6.8: the streams up to last_stream_id still finish; h2 would take no
                # frame after a GOAWAY (its connection state is CLOSED), so it is told to go on
                self.conn.state_machine.state = ConnectionState.CLIENT_OPEN

    def response(self, sid: int) -> tuple[int, bytes]:
        """(status, body) of stream `sid`, reading until it ends; `Refused` or `ConnectionError`."""
        while True:
            status, body, ended = self.answers[sid]
            if ended:
                del self.answers[sid]
                return status, bytes(body)
            if sid in self.resets:
                code = self.resets.pop(sid)
                if code == ErrorCodes.REFUSED_STREAM:
                    raise Refused(f"stream {sid} refused")
                raise ConnectionError(f"stream {sid} reset with {code}")
            if self.goaway is not None and sid > self.goaway:
                raise Refused(f"stream {sid} above GOAWAY's last stream {self.goaway}")
            if self.closed or not self.read():
                raise ConnectionError(f"connection closed under stream {sid} (GOAWAY: {self.goaway})")

    def request(self, method: str, path: str, body: bytes = b"", fields: Fields = ()) -> tuple[int, bytes]:
        return self.response(self.send(method, path, body, fields=fields))

    def wait_closed(self) -> None:
        """Read (and handle) until the server closes the connection."""
        while not self.closed and self.read():
            pass

    def close(self) -> None:
        hang_up(self.sock)
        self.closed = True


def get(port: int, path: str = "/", timeout: float = 10.0,
        tls: ssl.SSLContext | None = None) -> tuple[int, bytes]:  # fmt: skip
    """One GET on a connection of its own."""
    client = H2Client(port, timeout, tls=tls)
    try:
        return client.request("GET", path)
    except h2.exceptions.ProtocolError as e:
        raise ConnectionError(repr(e)) from e
    finally:
        client.close()


def frames(data: bytes) -> Iterator[Frame]:
    """The frames in bytes a server sent (read raw, past what h2's client state would take)."""
    while len(data) >= 9:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
        yield frame
        data = data[9 + length :]


def unfinished_head(port: int, timeout: float = 10.0, tls: ssl.SSLContext | None = None) -> socket.socket:
    """A slowloris over HTTP/2: the preface, then a HEADERS frame without END_HEADERS whose
    CONTINUATION never comes (the stream's head never ends)."""
    sock = connect(port, timeout, tls)
    block = hpack.Encoder().encode([(":method", "GET"), (":path", "/"), (":scheme", "http"),
                                    (":authority", "127.0.0.1")])  # fmt: skip
    head = HeadersFrame(1, block[: len(block) // 2], flags=["END_STREAM"])
    sock.sendall(PREFACE + SettingsFrame(0).serialize() + head.serialize())
    return sock
