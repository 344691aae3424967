"""How many connections wait in a listener's accept queue, and its limit, as the kernel counts them.

TCP: `getsockopt(TCP_INFO)` on a socket in the LISTEN state reports the accept queue in
`tcpi_unacked` and its limit (the effective backlog, after `somaxconn`) in `tcpi_sacked` (Linux
`tcp_get_info()`). Unix stream sockets have no such option; the sock_diag netlink interface
answers for one socket by inode with `UNIX_DIAG_RQLEN`, which for a listener is the same pair
(`sk_ack_backlog`, `sk_max_ack_backlog`). The kernel needs `unix_diag` for that (built in or the
module); without it the unix listener's queue is unknown (None) and the metric is left out.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct

_TCP_INFO_HEAD = struct.Struct("8B6I")  # state ... options; rto ato snd_mss rcv_mss unacked sacked
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
UDIAG_SHOW_RQLEN = 0x10
UNIX_DIAG_RQLEN = 4
NO_COOKIE = 0xFFFFFFFF
_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_UNIX_DIAG_REQ = struct.Struct("=BBHIIIII")  # family, protocol, pad, states, ino, show, cookie[2]
_UNIX_DIAG_MSG = struct.Struct("=BBBBIII")  # family, type, state, pad, ino, cookie[2]
_NLATTR = struct.Struct("=HH")
_RQLEN = struct.Struct("=II")


def tcp_queue(sock: socket.socket) -> tuple[int, int] | None:
    """(connections waiting to be accepted, the queue's limit) of a listening TCP socket."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_HEAD.size)
    except OSError:
        return None
    if len(info) < _TCP_INFO_HEAD.size:
        return None
    fields = _TCP_INFO_HEAD.unpack(info)
    return fields[12], fields[13]


def unix_queue(sock: socket.socket) -> tuple[int, int] | None:
    """The same for a listening unix stream socket, over sock_diag; None if the kernel cannot say."""
    try:
        inode = os.fstat(sock.fileno()).st_ino
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
            nl.settimeout(1.0)  # the kernel answers at once; this only bounds a surprise
            request = _UNIX_DIAG_REQ.pack(
                socket.AF_UNIX, 0, 0, 0xFFFFFFFF, inode, UDIAG_SHOW_RQLEN, NO_COOKIE, NO_COOKIE
            )
            header = _NLMSGHDR.pack(_NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
            nl.sendto(header + request, (0, 0))
            answer = nl.recv(8192)
    except OSError:
        return None
    return _parse_rqlen(answer, inode)


def _parse_rqlen(answer: bytes, inode: int) -> tuple[int, int] | None:
    if len(answer) < _NLMSGHDR.size + _UNIX_DIAG_MSG.size:
        return None
    length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(answer)
    if kind == NLMSG_ERROR or kind != SOCK_DIAG_BY_FAMILY:
        return None
    offset = _NLMSGHDR.size
    if _UNIX_DIAG_MSG.unpack_from(answer, offset)[4] != inode:
        return None
    offset += _UNIX_DIAG_MSG.size
    end = min(length, len(answer))
    while offset + _NLATTR.size <= end:
        size, kind = _NLATTR.unpack_from(answer, offset)
        if size < _NLATTR.size:
            return None
        if kind == UNIX_DIAG_RQLEN and size >= _NLATTR.size + _RQLEN.size:
            queued, limit = _RQLEN.unpack_from(answer, offset + _NLATTR.size)
            return queued, limit
        offset += (size + 3) & ~3
    return None


def listen_queue(sock: socket.socket) -> tuple[int, int] | None:
    """(queued, limit) for a listener of either family, or None when the kernel does not say."""
    with contextlib.suppress(OSError):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return tcp_queue(sock)
        if sock.family == socket.AF_UNIX:
            return unix_queue(sock)
    return None
