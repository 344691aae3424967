"""A mixed load on one server (the app tests/apps/mixed_load.py): keep-alive GETs, 1 MB uploads and
slow streaming responses, over HTTP/1.1 or HTTP/2 (h2c prior knowledge, or TLS with ALPN h2), plus
WebSockets echoing every second (over HTTP/1.1, TLS included). Failed requests are counted by kind
and WebSocket closes by code; the first few errors of each kind are kept as examples.

Retries are what a careful client does: a GET that fails on a *reused* HTTP/1.1 connection before
any response byte is sent again once on a fresh one (RFC 9112 9.3.1: idempotent only, so an upload
failing that way counts); over HTTP/2, a stream the server did not process (`Refused`) goes again.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections import Counter

import h2.exceptions
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from support.h2client import H2Client, Refused

UPLOAD = b"u" * 1_000_000
STREAM_CHUNKS = 10  # of 1000 bytes, 0.1 s apart (the app's CHUNK and PAUSE)
TIMEOUT = 30.0
# kind: (method, path, expected body or None to check it as a PID, idempotent)
REQUESTS = {
    "get": ("GET", "/", None, True),
    "upload": ("POST", "/upload", str(len(UPLOAD)).encode(), False),
    "stream": ("GET", f"/stream?{STREAM_CHUNKS}", b"s" * 1000 * STREAM_CHUNKS, True),
}


class Failed(Exception):
    """A request answered wrongly: its kind (`wrong-body`, `status-N`)."""


def failure_kind(e: BaseException, got_status: bool) -> str:
    """What a failed request's error says happened."""
    if isinstance(e, Failed):
        return str(e.args[0])
    if isinstance(e, (TimeoutError, socket.timeout)):
        return "timeout"
    if isinstance(e, http.client.IncompleteRead) or got_status:
        return "eof-mid-body"
    if isinstance(e, ConnectionResetError):
        return "econnreset"
    if isinstance(e, (http.client.RemoteDisconnected, BrokenPipeError)):
        return "eof-before-status"
    if isinstance(e, ConnectionError):  # HTTP/2: the connection ended (or reset) under the stream
        return "h2-lost-stream"
    return type(e).__name__


class MixedLoad:
    def __init__(self, port: int, *, http2: bool = False, tls: ssl.SSLContext | None = None,
                 ws_tls: ssl.SSLContext | None = None, gets: int = 3, uploads: int = 1, streams: int = 2,
                 websockets: int = 0) -> None:  # fmt: skip
        self.port = port
        self.http2 = http2
        self.tls = tls  # HTTP/2 over TLS (ALPN h2)
        self.ws_tls = ws_tls  # WebSockets over TLS (ALPN http/1.1)
        self.ok: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()  # "kind: what" -> count
        self.examples: dict[str, list[str]] = {}
        self.retried = 0
        self.ws_closes: Counter[str] = Counter()  # close code (or how it ended) -> count
        self.ws_messages = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        run = self._run_h2 if http2 else self._run_h1
        kinds = ["get"] * gets + ["upload"] * uploads + ["stream"] * streams
        self._websockets = [threading.Thread(target=self._websocket, daemon=True) for _ in range(websockets)]
        self._opened = 0  # WebSockets that opened or failed to
        self._threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in kinds]

    def __enter__(self) -> MixedLoad:
        """The WebSockets first, open before the requests (the first refork comes within them)."""
        for t in self._websockets:
            t.start()
        deadline = time.monotonic() + TIMEOUT
        while self._opened < len(self._websockets) and time.monotonic() < deadline:
            time.sleep(0.01)
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._websockets + self._threads:
            t.join(TIMEOUT + 5)

    def wait_for(self, requests: int, streams: int, messages: int, timeout: float) -> None:
        """Until `requests` more requests, `streams` more streams and `messages` more WebSocket
        echoes were served (or `timeout` seconds passed)."""
        deadline = time.monotonic() + timeout
        goal = (sum(self.ok.values()) + requests, self.ok["stream"] + streams, self.ws_messages + messages)
        while time.monotonic() < deadline and (
            sum(self.ok.values()) < goal[0] or self.ok["stream"] < goal[1] or self.ws_messages < goal[2]
        ):
            time.sleep(0.05)

    def _fail(self, what: str, kind: str, e: BaseException | str) -> None:
        key = f"{what}: {kind}"
        with self._lock:
            self.failures[key] += 1
            self.examples.setdefault(key, [])
            if len(self.examples[key]) < 3:
                self.examples[key].append(f"{time.strftime('%H:%M:%S')} {e!r}")

    def _check(self, kind: str, status: int, body: bytes) -> None:
        expected = REQUESTS[kind][2]
        if status != 200:
            raise Failed(f"status-{status}")
        if (body != expected) if expected is not None else not body.isdigit():
            raise Failed("wrong-body")
        with self._lock:
            self.ok[kind] += 1

    def _run_h1(self, kind: str) -> None:
        method, path, _, idempotent = REQUESTS[kind]
        body = UPLOAD if method == "POST" else None
        conn, reused = None, False
        while not self._stop.is_set():
            got_status = False
            try:
                if conn is None:
                    conn, reused = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT), False
                conn.request(method, path, body=body)
                resp = conn.getresponse()
                got_status = True
                self._check(kind, resp.status, resp.read())
                reused = True
                if resp.will_close:
                    conn.close()
                    conn = None
            except Exception as e:  # noqa: BLE001 - every error is a failed request, by kind
                conn.close() if conn else None
                conn = None
                how = failure_kind(e, got_status)
                if reused and idempotent and how in ("eof-before-status", "econnreset"):
                    with self._lock:
                        self.retried += 1
                    continue  # the idempotent retry on a fresh connection
                self._fail(kind, how + (" (reused connection)" if reused else ""), e)
        if conn is not None:
            conn.close()

    def _run_h2(self, kind: str) -> None:
        method, path, _, _ = REQUESTS[kind]
        conn: H2Client | None = None
        while not self._stop.is_set():
            try:
                if conn is None or not conn.usable:
                    conn.close() if conn else None
                    conn = None
                    conn = H2Client(self.port, timeout=TIMEOUT, tls=self.tls)
                if method == "POST":
                    self._check(kind, *self._upload_h2(conn, path))
                else:
                    self._check(kind, *conn.request(method, path))
            except Refused:
                with self._lock:
                    self.retried += 1
            except (OSError, h2.exceptions.ProtocolError, Failed) as e:
                conn.close() if conn else None
                conn = None
                self._fail(kind, failure_kind(e, False), e)
        if conn is not None:
            conn.close()

    @staticmethod
    def _upload_h2(conn: H2Client, path: str) -> tuple[int, bytes]:
        """The 1 MB body as the flow-control windows let it go (reading WINDOW_UPDATEs between)."""
        sid = conn.send("POST", path, length=len(UPLOAD))
        sent = 0
        while sent < len(UPLOAD):
            sent += conn.send_data(sid, UPLOAD[sent:], end=True)
            if sent < len(UPLOAD):
                answer = conn.answers.get(sid)
                if sid in conn.resets or conn.closed or (answer and answer[2]):
                    break  # answered or refused early: response() says which
                if not conn.read():
                    break
        return conn.response(sid)

    def _websocket(self) -> None:
        scheme = "wss" if self.ws_tls else "ws"
        opened = False
        try:
            with ws_connect(f"{scheme}://127.0.0.1:{self.port}/ws", ssl=self.ws_tls, open_timeout=TIMEOUT,
                            close_timeout=5) as ws:  # fmt: skip
                opened = True
                with self._lock:
                    self._opened += 1
                self._echo(ws)
        except ConnectionClosed as e:
            self._closed(str(e.rcvd.code) if e.rcvd is not None else "no close frame", e)
        except Exception as e:  # noqa: BLE001 - a WebSocket that never opened, or any other end
            if opened:
                self._closed(type(e).__name__, e)
            else:
                self._fail("websocket", "connect", e)
        finally:
            if not opened:
                with self._lock:
                    self._opened += 1

    def _echo(self, ws: ClientConnection) -> None:
        """A message a second, each answered with itself, until the load stops."""
        n = 0
        while not self._stop.wait(1.0):
            n += 1
            ws.send(str(n))
            reply = ws.recv(timeout=TIMEOUT)
            if reply != str(n):
                self._fail("websocket", "wrong-echo", f"{reply!r} for {n}")
                continue
            with self._lock:
                self.ws_messages += 1

    def _closed(self, how: str, e: BaseException) -> None:
        with self._lock:
            self.ws_closes[how] += 1
            when = time.strftime("%H:%M:%S")
            self.examples.setdefault(f"websocket close {how}", []).append(f"{when} {e!r}")

    def summary(self) -> str:
        failed = ", ".join(f"{k} x{v}" for k, v in sorted(self.failures.items())) or "none"
        closes = ", ".join(f"{k} x{v}" for k, v in sorted(self.ws_closes.items())) or "none"
        return f"ok {dict(self.ok)}, retried {self.retried}, failed: {failed}; ws closes: {closes}"
