"""How processes are made: the child subreaper, the double fork, and the clean unwind.

A child made by `fork_detached` is a grandchild of the caller whose middle parent exits at once,
so the kernel reparents it to the nearest subreaper: the monitor. Every mold and worker is then
the monitor's direct child, which it reaps and signals, whoever forked it.

The new process must not keep running the code that forked it (a worker's request loop, a mold's
command loop). It raises an `Unwind` exception that travels up to `run_child`, the one top-level
loop of every child, which then starts the new role with a short stack (Pitchfork's clean_fork).
A worker's child that is to become a mold raises `Promoted` instead: the worker role does not know
the mold role; the mold that forked the worker turns it into an `Unwind`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
# What the monitor handles; a new child puts each back to the default before its role decides.
MONITOR_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)  # fmt: skip


class Unwind(SystemExit):
    """Raised in a freshly forked process to drop the stack it inherited.

    Derives from SystemExit so that asyncio, uvloop and thread pools let it through untouched.
    """

    def __init__(self, start: Callable[[], int]) -> None:
        super().__init__(0)
        self.start = start


class Promoted(SystemExit):
    """Raised in a worker's double-forked child that is to become the mold of `generation`.

    The worker does not know how a mold runs: the mold that forked it catches this at the bottom of
    the worker's stack and unwinds into its own role, so neither role module imports the other.
    """

    def __init__(self, generation: int) -> None:
        super().__init__(0)
        self.generation = generation


def flush_stdio() -> None:
    """Write out what print() left in sys.stdout/sys.stderr's buffers (a config file's or a hook's,
    with stdout a pipe or a file). Run before every fork: a buffer copied into the child would be
    written once by each process that exits, the same lines once per worker."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, None, or a reader gone: nothing to keep
            stream.flush()


os.register_at_fork(before=flush_stdio)


BACKOFF_FIRST, BACKOFF_MAX = 0.1, 30.0  # seconds


def backoff_delay(failures: int) -> float:
    """The wait before respawning after `failures` early deaths in a row: 0.1 s doubling to 30 s."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (failures - 1)) if failures > 0 else 0.0


def make_subreaper() -> bool:
    """Become the reaper of orphaned descendants; False where the kernel does not support it."""
    if os.environ.get("REFORK_NO_SUBREAPER"):  # for testing the fallback
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result: int = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return result == 0
    except (OSError, AttributeError):
        return False


def signal_when_parent_dies(signum: int) -> bool:
    """Have the kernel send `signum` to this process when its parent dies; False if it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        result: int = libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        return result == 0
    except (OSError, AttributeError):
        return False


def fork_detached() -> bool:
    """Double fork. Returns True in the grandchild, False in the caller once the middle is reaped."""
    middle = os.fork()
    if middle == 0:
        try:
            if os.fork() == 0:
                return True
        except BaseException:
            os._exit(1)
        os._exit(0)
    while True:
        try:
            os.waitpid(middle, 0)
            break
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    return False


def reset_signals_in_child() -> None:
    """A new process starts from default signal handling; its role installs its own."""
    signal.set_wakeup_fd(-1)
    for sig in MONITOR_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    # Terminal signals (Ctrl-C) go to the monitor only; it decides what children do.
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def run_child(start: Callable[[], int]) -> None:
    """The top-level loop of every child process. Never returns."""
    code = 1
    while True:
        try:
            code = start()
            break
        except Unwind as unwind:
            start = unwind.start
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            break
        except BaseException:
            import logging

            logging.getLogger("refork").exception("unexpected error; exiting")
            code = 1
            break
    try:
        flush_stdio()
    finally:
        os._exit(code)


def child_pids() -> list[int]:
    """This process's children, alive or not yet reaped (Linux's /proc/<pid>/task/*/children)."""
    pids: list[int] = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(pid) for pid in f.read().split()]
        except OSError:
            continue
    return pids


def kill_strays() -> None:
    """Kill and reap the children still here when the monitor is done with every child it knows.

    A worker is the monitor's child from its fork, before the monitor hears of it: one forked as
    the mold was stopped is known to no one. It must not outlive the monitor, hold its port, or
    print after the monitor's last line.
    """
    pids = child_pids()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
