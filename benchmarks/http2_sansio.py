"""HTTP/2's own cost, server side: refork's sans-IO ``Http2Connection`` fed batches of 10 GET
streams (the client's bytes made up front by an h2 client) and answering each with a 13-byte body;
no socket, no app. Prints the best of 5 runs in µs a request.

    PYTHONPATH=. python benchmarks/http2_sansio.py [batches, 500 at most: the client never acks]
"""

from __future__ import annotations

import sys
import time

import h2.config
import h2.connection

from refork.http.h2 import Http2Connection, Http2Limits, StreamOpened

GET = [(b":method", b"GET"), (b":path", b"/"), (b":scheme", b"http"), (b":authority", b"localhost"),
       (b"user-agent", b"h2load")]  # fmt: skip
HEADERS = [(b"content-type", b"text/plain"), (b"content-length", b"13")]


def client_bytes(batches: int) -> tuple[bytes, list[bytes]]:
    """The preface and SETTINGS, then each batch of 10 requests."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    first, out, sid = client.data_to_send(), [], 1
    for _ in range(batches):
        for _ in range(10):
            client.send_headers(sid, GET, end_stream=True)
            sid += 2
        out.append(client.data_to_send())
        client.streams.clear()  # (it never reads the answers: kept under its stream limit)
    return first, out


def run(first: bytes, batches: list[bytes]) -> float:
    server = Http2Connection(Http2Limits())
    server.start()
    server.receive(first)
    server.data_to_send()
    opened = 0
    start = time.perf_counter()
    for data in batches:
        for event in server.receive(data):
            if type(event) is StreamOpened:
                opened += 1
                server.respond(event.stream_id, 200, HEADERS, False)
                server.send_body(event.stream_id, memoryview(b"Hello, World!"), True)
        server.data_to_send()
    elapsed = time.perf_counter() - start
    assert opened == 10 * len(batches) and not server.ended, (opened, server.ended)
    return elapsed / opened * 1e6


def main() -> None:
    count = min(int(sys.argv[1]) if len(sys.argv) > 1 else 500, 500)  # (13 bytes each: the client's window)
    first, batches = client_bytes(count)
    runs = [run(first, batches) for _ in range(5)]
    print(f"Python {sys.version.split()[0]}: {min(runs):.1f} µs a request (best of 5: "
          f"{', '.join(f'{r:.1f}' for r in runs)})")  # fmt: skip


if __name__ == "__main__":
    main()
