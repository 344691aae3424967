"""The WebSocket opening handshake as the server answers it (RFC 6455 4.2) and the
permessage-deflate it agrees (RFC 7692): pure functions of a parsed request, no I/O. The ASGI
loop's :class:`refork.serving.asgi.websocket_protocol.WebSocketProtocol` runs the connection."""

from __future__ import annotations

import base64
import binascii
import zlib

from wsproto.extensions import Extension, PerMessageDeflate
from wsproto.frame_protocol import CloseReason, FrameDecoder, FrameProtocol, Opcode, RsvBits
from wsproto.handshake import server_extensions_handshake
from wsproto.utilities import generate_accept_token

from refork.http.events import Request
from refork.http.response import simple_response

COMPRESS_WINDOW_BITS = 12  # a 4 KiB window (not 32 KiB) for what the server sends, as websockets does
COMPRESS_MEM_LEVEL = 5  # zlib's default is 8: about 91 KiB a connection's compressor touches, 29 KiB at 12/5


class BoundedDeflate(PerMessageDeflate):
    """permessage-deflate that inflates no piece of a frame past --ws-max-size: wsproto's own
    inflates whatever a piece holds, and a few kilobytes of deflate can hold gigabytes (a zip
    bomb). Past the limit the message is too big (1009) before the memory is spent.

    Its compressor is also smaller than wsproto's: a window never larger than the negotiated one
    needs no negotiation (any inflater reads it), and memLevel is the server's own business."""

    def __init__(self, max_size: int) -> None:
        super().__init__()
        self.max_size = max_size

    def frame_outbound(
        self, proto: FrameDecoder | FrameProtocol, opcode: Opcode, rsv: RsvBits, data: bytes, fin: bool
    ) -> tuple[RsvBits, bytes]:
        starts = opcode is not Opcode.CONTINUATION and self._compressible_opcode(opcode)
        if self._compressor is None and starts:
            bits = min(self.server_max_window_bits, COMPRESS_WINDOW_BITS)
            level = zlib.Z_DEFAULT_COMPRESSION
            self._compressor = zlib.compressobj(level, zlib.DEFLATED, -bits, COMPRESS_MEM_LEVEL)
        return super().frame_outbound(proto, opcode, rsv, data, fin)

    def frame_inbound_payload_data(
        self, proto: FrameDecoder | FrameProtocol, data: bytes
    ) -> bytes | CloseReason:
        if not self._inbound_compressed or not self._inbound_is_compressible:
            return data
        decompressor = self._decompressor
        assert decompressor is not None
        try:
            out = decompressor.decompress(bytes(data), self.max_size + 1)
        except zlib.error:
            return CloseReason.INVALID_FRAME_PAYLOAD_DATA
        if decompressor.unconsumed_tail:
            return CloseReason.MESSAGE_TOO_BIG
        return out


def header(request: Request, name: bytes) -> bytes | None:
    for key, value in request.headers:
        if key == name:
            return value
    return None


def header_list(request: Request, name: bytes) -> list[str]:
    """A comma-separated header's elements, over all its lines."""
    out: list[str] = []
    for key, value in request.headers:
        if key == name:
            out.extend(item.strip() for item in value.decode("latin-1").split(",") if item.strip())
    return out


def handshake_error(request: Request) -> int:
    """0 for a valid opening handshake (RFC 6455 4.2.1), else the status to answer."""
    if request.http_version != "1.1":
        return 400
    version = header(request, b"sec-websocket-version")
    if version is None or version.strip() != b"13":
        return 426
    key = header(request, b"sec-websocket-key")
    if key is None:
        return 400
    try:
        if len(base64.b64decode(key.strip(), validate=True)) != 16:
            return 400
    except (binascii.Error, ValueError):
        return 400
    return 0


def refusal(status: int) -> bytes:
    """The response to a handshake refused with `status` (426 says which version we speak,
    RFC 6455 4.4)."""
    response = simple_response(status)
    if status == 426:
        response = response.replace(b"\r\n", b"\r\nSec-WebSocket-Version: 13\r\n", 1)
    return response


def accept_response(
    request: Request,
    subprotocol: str | None,
    headers: list[tuple[bytes, bytes]],
    deflate: bool,
    max_size: int,
) -> tuple[bytes, list[Extension]]:
    """The 101 answering `request` (with the app's subprotocol and headers) and the extensions
    agreed: permessage-deflate when `deflate` is on and the client offers it."""
    key = header(request, b"sec-websocket-key") or b""
    lines = [
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + generate_accept_token(key.strip()) + b"\r\n"
    ]
    if subprotocol:
        lines.append(b"Sec-WebSocket-Protocol: " + subprotocol.encode("latin-1") + b"\r\n")
    extensions: list[Extension] = []
    offers = header_list(request, b"sec-websocket-extensions")
    if offers and deflate:
        bounded = BoundedDeflate(max_size)
        agreed = server_extensions_handshake(offers, [bounded])
        if agreed:
            lines.append(b"Sec-WebSocket-Extensions: " + agreed + b"\r\n")
            extensions.append(bounded)
    for name, value in headers:
        lines.append(name + b": " + value + b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines), extensions
