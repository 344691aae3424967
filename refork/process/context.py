"""What every refork process shares: set up by the monitor before the first fork."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field

import setproctitle

from refork.config import Config
from refork.process import messages
from refork.process.readiness import Readiness
from refork.process.slots import Slots

log = logging.getLogger("refork")


@dataclass
class ProcessContext:
    config: Config
    listeners: list[socket.socket]
    report: socket.socket  # the sending end of the shared report socket
    slots: Slots
    subreaper: bool
    monitor_pid: int = field(default_factory=os.getpid)
    readiness: Readiness = field(default_factory=Readiness)  # written by the monitor only

    def register(self, spawned: messages.Spawned) -> socket.socket:
        """Tell the monitor this process exists and hand it a command channel; return our end."""
        monitor_end, own_end = messages.command_pair()
        try:
            messages.send(self.report, spawned, monitor_end.fileno())
        finally:
            monitor_end.close()
        return own_end

    def tell(self, message: messages.Message) -> bool:
        """Report to the monitor; False if it is gone."""
        try:
            messages.send(self.report, message)
            return True
        except OSError:
            return False


def set_title(title: str) -> None:
    """Name the process in ps/top: "refork: worker 3 (gen 2)"."""
    setproctitle.setproctitle(title)
