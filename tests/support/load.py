"""A small load generator for tests: threads sending GETs and counting failures, over HTTP/1.1
or (http2=True) HTTP/2, with prior knowledge or over TLS (`tls`: a context offering ALPN h2), each
thread on a connection of its own.

HTTP/1.1: keep-alive connections are reused; a request that fails on a *reused* connection before
any response byte arrived is retried once on a fresh one, as RFC 9112 §9.3.1 allows for idempotent
requests (the server may close an idle connection at any time). Anything else is a failure.

HTTP/2: a stream the server says it did not process (above its GOAWAY's last stream id, or reset
with REFUSED_STREAM, RFC 9113 8.7) goes again on a new connection, as does the next request after
a GOAWAY; a connection that ends under a stream without saying so loses that request: a failure.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time

import h2.exceptions

from support.h2client import H2Client, Refused


class Load:
    def __init__(
        self, port: int, path: str = "/", threads: int = 4, keep_alive: bool = True, http2: bool = False,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.port = port
        self.path = path
        self.keep_alive = keep_alive
        self.http2 = http2
        self.tls = tls  # (HTTP/2 over TLS)
        self.ok = 0
        self.failures: list[str] = []
        self.pids: set[int] = set()
        self._warm: set[int] = set()  # threads whose connection has carried a response
        self._stop = threading.Event()
        self._lock = threading.Lock()
        run = self._run_h2 if http2 else self._run
        self._threads = [threading.Thread(target=run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def wait_for_requests(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        start = self.ok
        while self.ok - start < count and time.monotonic() < deadline:
            time.sleep(0.02)

    def wait_until_warm(self, timeout: float = 30.0) -> None:
        """Until every thread holds a connection that has carried a response.

        A request in flight on a fresh connection when its worker is SIGKILLed is lost for good;
        on a reused one the client may retry it. Tests that kill a worker wait for this first.
        """
        deadline = time.monotonic() + timeout
        while len(self._warm) < len(self._threads):
            if time.monotonic() > deadline:
                warm, total = len(self._warm), len(self._threads)
                raise TimeoutError(f"only {warm} of {total} load threads got a response")
            time.sleep(0.01)

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def _served(self, status: int, body: bytes) -> None:
        if status != 200:
            raise RuntimeError(f"status {status}: {body[:100]!r}")
        with self._lock:
            self.ok += 1
            self._warm.add(threading.get_ident())
            try:
                self.pids.add(int(body.split()[0]))
            except (ValueError, IndexError):
                pass

    def _run_h2(self) -> None:
        conn: H2Client | None = None
        while not self._stop.is_set():
            try:
                if conn is None or not conn.usable or not self.keep_alive:
                    if conn is not None:
                        conn.close()
                    conn = None  # (a connect that fails is a failure, and tried again)
                    conn = H2Client(self.port, tls=self.tls)
                self._served(*conn.request("GET", self.path))
            except Refused:
                continue  # not processed: again (on a new connection after a GOAWAY)
            except (OSError, h2.exceptions.ProtocolError, RuntimeError) as e:
                if conn is not None:
                    conn.close()
                conn = None
                with self._lock:
                    self.failures.append(repr(e))
        if conn is not None:
            conn.close()

    def _run(self) -> None:
        conn = self._connect()
        reused = False
        headers = {} if self.keep_alive else {"Connection": "close"}
        while not self._stop.is_set():
            try:
                conn.request("GET", self.path, headers=headers)
                resp = conn.getresponse()
                self._served(resp.status, resp.read())
                reused = True
                if resp.will_close or not self.keep_alive:
                    conn.close()
                    conn = self._connect()
                    reused = False
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                conn = self._connect()
                if reused:
                    reused = False
                    continue  # the idempotent retry on a fresh connection
                with self._lock:
                    self.failures.append(repr(e))
            except Exception as e:  # noqa: BLE001 - every other error is a failed request
                conn.close()
                conn = self._connect()
                reused = False
                with self._lock:
                    self.failures.append(repr(e))
        conn.close()


def send_until_refused(sock, head: bytes, filler: bytes, total: int) -> tuple[int, bytes]:
    """Send head + up to `total` filler bytes while a thread reads the answer (the server closes
    early with unread bytes, so the reply must be read as it comes, before the reset)."""
    import threading

    got = bytearray()

    def read():
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                got.extend(data)
        except OSError:
            return

    reader = threading.Thread(target=read)
    reader.start()
    sent = 0
    try:
        sock.sendall(head)
        while sent < total:
            sock.sendall(filler)
            sent += len(filler)
    except OSError:
        pass
    reader.join(10)
    return sent, bytes(got)
