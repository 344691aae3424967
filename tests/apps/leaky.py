"""An app that keeps connections and threads the way real apps leak them into a fork.

REFORK_TEST_PEER=PORT: connect to 127.0.0.1:PORT at import (a database client made at load time).
REFORK_TEST_THREAD=1: start a background thread at import (a metrics poller).
GET /connect opens a connection at request time and keeps it (a persistent DB connection);
close_all() closes them (what a pre_promotion hook calls).
"""

import os
import socket
import threading
import time

_kept: list[socket.socket] = []
_PEER = ("127.0.0.1", int(os.environ.get("REFORK_TEST_PEER") or 0))


def _connect() -> None:
    _kept.append(socket.create_connection(_PEER))


if os.environ.get("REFORK_TEST_CONNECT_AT_IMPORT") and _PEER[1]:
    _connect()
if os.environ.get("REFORK_TEST_THREAD"):
    threading.Thread(target=time.sleep, args=(3600,), name="leaky-poller", daemon=True).start()


def close_all() -> None:
    while _kept:
        _kept.pop().close()


def app(environ, start_response):
    if environ["PATH_INFO"] == "/connect":
        _connect()
    body = f"{os.getpid()} {len(_kept)}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
