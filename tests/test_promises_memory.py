"""The memory and disk promises, on every request path each applies to (the paths and helpers of
tests/test_promises.py): what one client's bytes can hold of a worker.

- Request heads are bounded as they arrive: a line longer than its limit is refused as soon as that
  many bytes came without its end, the heads being received hold at most --max-request-memory of a
  worker, and the worker's RSS stays near its baseline during a flood of them and returns to it
  after (bodies held in memory likewise).
- WebSocket messages waiting for the app are bounded per connection and per worker
  (--ws-max-memory), deflated ones too: a flood keeps the worker near its baseline.
- The spool holds what has arrived of a body, never what its header declares; a full spool
  directory is a 507 with Retry-After, not a reset.

RSS is read from /proc/PID/smaps_rollup of the worker itself, before, during and after each flood.
"""

from __future__ import annotations

import ctypes
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from test_promises import serve, wsgi_paths

MIB = 1 << 20


def rss(pid: int) -> int:
    """The resident set of a process, in bytes."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no Rss line for {pid}")


def spool_files(pid: int, directory: str | Path | None = None) -> list[int]:
    """The sizes of the request bodies a worker has spooled now: its unlinked files in the spool
    directory (tempfile's default unless given)."""
    where = f"{directory or tempfile.gettempdir()}/"
    sizes = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith(where) and link.endswith(" (deleted)"):
                sizes.append(os.stat(f"/proc/{pid}/fd/{fd}").st_size)
        except OSError:
            continue
    return sizes


def response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body (or what came before the server closed)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


class Upload:
    """A POST /upload sent from a thread while another reads the answer as it comes: a server that
    refuses a body early closes with unread bytes, and its answer must be read before the reset."""

    def __init__(self, port: int, length: int, send: int | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.length = length
        self.to_send = length if send is None else send
        self.sent = 0
        self.answer = b""
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.sock.sendall(b"POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % length)
        self.more(self.to_send)

    def _read(self) -> None:
        try:
            self.answer = response(self.sock)
        except OSError:
            pass

    def more(self, n: int) -> None:
        chunk = b"u" * 65536
        try:
            while n > 0 and not self.answer:
                self.sock.sendall(chunk[:n])
                self.sent += min(n, len(chunk))
                n -= len(chunk)
        except OSError:
            pass

    def finish(self) -> bytes:
        self.more(self.length - self.sent)
        self.reader.join(30)
        self.close()
        return self.answer

    def close(self) -> None:
        """Gone for good (shutdown first: the reading thread's recv holds the socket open)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


# -- the spool holds what arrived ----------------------------------------------------------------
@wsgi_paths
def test_declared_lengths_reserve_nothing_of_the_spool(start_server, path):
    """Four uploads declaring a gigabyte each and sending a little more than the in-memory
    threshold hold what they sent, not the 4 GiB budget: another upload is served meanwhile, and the
    worker's RSS does not grow with them (their bytes are on disk)."""
    server = serve(start_server, path, workers=1)
    pid = server.workers()[0]["pid"]
    server.get("/")
    before = rss(pid)
    holders = [Upload(server.port, 1 << 30, send=1100 << 10) for _ in range(4)]
    server.wait_for(lambda: len([s for s in spool_files(pid) if s >= 1 << 20]) == 4, what="4 spooled bodies")
    upload = Upload(server.port, 2 * MIB)
    answer = upload.finish()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n%d" % (2 * MIB)), answer[:300]
    during = rss(pid)
    for holder in holders:
        holder.close()
    server.wait_for(lambda: not spool_files(pid), what="the spooled bodies let go")
    assert during - before < 16 * MIB, (before, during)


def private_tmpfs(mount: Path, size: str) -> Callable[[], None]:
    """A preexec_fn: the server runs in a mount namespace of its own with a tmpfs of `size` on
    `mount` (a user namespace too when not root), so its spool directory can really fill up."""

    def enter() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(0x00020000 | (0 if uid == 0 else 0x10000000)):  # CLONE_NEWNS (| NEWUSER)
            raise OSError(ctypes.get_errno(), "unshare")
        if uid:
            for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w") as f:
                    f.write(text)
        if libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None):  # MS_REC | MS_PRIVATE
            raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
        if libc.mount(b"tmpfs", str(mount).encode(), b"tmpfs", 0, f"size={size}".encode()):
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {mount}")

    return enter


@wsgi_paths
def test_a_full_spool_directory_is_a_507_with_retry_after(start_server, path, tmp_path):
    """The spool directory's disk fills up under two uploads: the one that finds it full gets a
    507 with Retry-After (not a reset), its file is let go, and the other one completes."""
    spool = tmp_path / "spool"
    spool.mkdir()
    server = serve(start_server, path, "--spool-dir", str(spool), workers=1,
                   preexec_fn=private_tmpfs(spool, "3m"))  # fmt: skip
    pid = server.workers()[0]["pid"]
    first = Upload(server.port, 2 * MIB, send=1536 << 10)
    server.wait_for(lambda: any(s >= 1400 << 10 for s in spool_files(pid, spool)), what="the first body spooled")
    second = Upload(server.port, 2 * MIB)
    answer = second.finish()
    assert answer.startswith(b"HTTP/1.1 507 ") and b"\r\nRetry-After: 1\r\n" in answer, answer[:300]
    server.wait_for(lambda: len(spool_files(pid, spool)) == 1, what="the refused body let go")
    answer = first.finish()
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"\r\n\r\n%d" % (2 * MIB)), answer[:300]
    assert server.get("/")[0] == 200
