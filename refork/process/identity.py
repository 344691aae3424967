"""gunicorn's process settings: --daemon, --user/--group, --umask.

The monitor stays who started it (it binds privileged ports, writes the pid file, signals every
child); a fresh mold drops to --user/--group right after its fork, before it imports the app, so
the app, its workers and the molds promoted from them never run as root.
"""

from __future__ import annotations

import grp
import os
import pwd
import sys

from refork.config import Config
from refork.errors import ConfigError


def ids(config: Config) -> tuple[int | None, int | None]:
    """(uid, gid) of --user/--group; gid defaults to the user's primary group."""
    uid = gid = None
    if config.user is not None:
        uid = int(config.user) if config.user.isdigit() else pwd.getpwnam(config.user).pw_uid
        try:
            gid = pwd.getpwuid(uid).pw_gid
        except KeyError:
            gid = None
    if config.group is not None:
        gid = int(config.group) if config.group.isdigit() else grp.getgrnam(config.group).gr_gid
    return uid, gid


def check_switch(config: Config) -> None:
    """At start: --user/--group other than ours need root (one line, exit 2)."""
    uid, gid = ids(config)
    other = (uid is not None and uid != os.geteuid()) or (gid is not None and gid != os.getegid())
    if other and os.geteuid() != 0:
        raise ConfigError(f"--user/--group need root: refork runs as uid {os.geteuid()}")


def drop_privileges(config: Config) -> None:
    """In a fresh mold: become --user/--group (supplementary groups: none, or the user's with
    --initgroups)."""
    uid, gid = ids(config)
    if gid is not None and gid != os.getegid():
        if config.initgroups and config.user is not None:
            os.initgroups(pwd.getpwuid(uid).pw_name if uid is not None else config.user, gid)
        else:
            os.setgroups([])
        os.setgid(gid)
    if uid is not None and uid != os.geteuid():
        if config.initgroups and gid is None:
            os.initgroups(pwd.getpwuid(uid).pw_name, os.getegid())
        os.setuid(uid)


def chown_files(config: Config, paths: list[str]) -> None:
    """Log files the workers reopen on USR1 must be theirs (as gunicorn chowns them)."""
    uid, gid = ids(config)
    if uid is None and gid is None:
        return
    for path in paths:
        try:
            os.chown(path, -1 if uid is None else uid, -1 if gid is None else gid)
        except OSError:
            pass


def daemonize(keep_stdio: bool) -> None:
    """Double fork into a new session; the first process exits 0 once the daemon exists. stdio
    goes to /dev/null unless `keep_stdio` (--enable-stdio-inheritance)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    if not keep_stdio:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    else:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
