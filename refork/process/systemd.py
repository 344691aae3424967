"""systemd integration: socket activation and the notify protocol (``Type=notify``).

Socket activation (sd_listen_fds(3)): systemd (or ``systemd-socket-activate``) passes listening
sockets as fds 3, 4, ... with ``LISTEN_FDS=n``, ``LISTEN_PID=<our pid>`` and optionally
``LISTEN_FDNAMES=a:b``. The monitor then serves on them instead of binding ``--bind``, and removes
the variables so neither its children nor the app see them.

Notify (sd_notify(3)): datagrams of ``KEY=value`` lines to ``$NOTIFY_SOCKET`` (a path, or ``@name``
for the abstract namespace). The monitor sends ``READY=1`` when ``--ready-when`` is met,
``RELOADING=1`` with ``MONOTONIC_USEC=`` when a HUP starts a new mold and ``READY=1`` when it is
done, ``STOPPING=1`` on a stop, ``STATUS=`` with the generation and the workers up, and
``WATCHDOG=1`` every half ``$WATCHDOG_USEC`` (when ``$WATCHDOG_PID`` is unset or ours). Only the
monitor talks to systemd: the variables are removed from the environment before the first fork.

The parsing and the messages are pure functions; :class:`Notifier` is the one socket.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import MutableMapping

log = logging.getLogger("refork")

LISTEN_FDS_START = 3
ACTIVATION_VARS = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def listen_fds(environ: MutableMapping[str, str], pid: int) -> list[tuple[int, str]]:
    """The (fd, name) pairs systemd passed to process `pid`; [] when none were (or not to us)."""
    try:
        count = int(environ.get("LISTEN_FDS", "0"))
        target = int(environ.get("LISTEN_PID", "0"))
    except ValueError:
        return []
    if count <= 0 or target != pid:
        return []
    names = environ.get("LISTEN_FDNAMES", "").split(":") if environ.get("LISTEN_FDNAMES") else []
    return [(LISTEN_FDS_START + i, names[i] if i < len(names) else "unknown") for i in range(count)]


def take_listen_fds(environ: MutableMapping[str, str], pid: int) -> list[tuple[int, str]]:
    """listen_fds(), and the activation variables removed from `environ` (os.environ: children too)."""
    fds = listen_fds(environ, pid)
    for name in ACTIVATION_VARS:
        environ.pop(name, None)
    return fds


def notify_address(value: str) -> str | bytes | None:
    """$NOTIFY_SOCKET as a socket address: "@name" is abstract (a leading NUL), else a path."""
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if value.startswith("/"):
        return value
    return None  # vsock: and other forms are not supported


def watchdog_interval(environ: MutableMapping[str, str], pid: int) -> float | None:
    """Seconds between two WATCHDOG=1: half of $WATCHDOG_USEC, if the watchdog is meant for us."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", "0"))
        target = int(environ.get("WATCHDOG_PID", str(pid)) or pid)
    except ValueError:
        return None
    if usec <= 0 or target != pid:
        return None
    return usec / 2 / 1e6


def milestone_message(milestone: str, monotonic_usec: int) -> str:
    """The notify message for a supervisor milestone (refork.process.supervisor.events.Announce)."""
    if milestone == "reloading":
        return f"RELOADING=1\nMONOTONIC_USEC={monotonic_usec}"
    if milestone == "stopping":
        return "STOPPING=1"
    return "READY=1"  # "ready", "reloaded"


def status_text(generation: int, ready: int, target: int, state: str = "") -> str:
    """STATUS= for systemctl status: "gen 2, 4/4 workers ready"."""
    return f"gen {generation}, {ready}/{target} workers ready" + (f", {state}" if state else "")


class Notifier:
    """The monitor's datagram socket to systemd; sending never raises and never blocks."""

    def __init__(self, address: str | bytes, watchdog: float | None) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.watchdog = watchdog
        self.next_watchdog = 0.0
        self.status = ""

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str], pid: int) -> Notifier | None:
        """From $NOTIFY_SOCKET (None if unset); removes the notify variables from `environ`."""
        address = notify_address(environ.get("NOTIFY_SOCKET", ""))
        watchdog = watchdog_interval(environ, pid)
        for name in NOTIFY_VARS:
            environ.pop(name, None)
        if address is None:
            return None
        return cls(address, watchdog)

    def send(self, message: str) -> bool:
        try:
            self.sock.sendto(message.encode(), self.address)
            return True
        except OSError as e:
            log.debug("NOTIFY_SOCKET: cannot send %r: %s", message, e)
            return False

    def announce(self, milestone: str, status: str) -> None:
        usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
        self.status = status
        self.send(f"{milestone_message(milestone, usec)}\nSTATUS={status}")

    def tick(self, now: float, status: str) -> None:
        """Once per loop: WATCHDOG=1 when due, STATUS= when it changed."""
        if status != self.status:
            self.status = status
            self.send(f"STATUS={status}")
        if self.watchdog is not None and now >= self.next_watchdog:
            self.next_watchdog = now + self.watchdog
            self.send("WATCHDOG=1")

    def close(self) -> None:
        self.sock.close()
