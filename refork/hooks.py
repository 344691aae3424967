"""What gunicorn's server hooks receive: `server` (gunicorn's Arbiter) and `worker`, and how they run.

A hook from the config file is called with gunicorn's arguments (refork.config.table.HOOKS lists
them). refork's processes differ from gunicorn's: the monitor never imports the app, a *mold*
forks the workers, so `pre_fork` runs in the mold (gunicorn: the master), and `server` in a mold
or worker is that process's view of the monitor (its pid, the config, the worker count when the
process was forked). Each object offers what real hooks use; docs/from-gunicorn.md says which.

`this_worker()` is the current worker process's `worker` object (None elsewhere): the request
paths hand it to `pre_request(worker, req)` and `post_request(worker, req, environ, resp)`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from refork.addresses import gunicorn_address
from refork.config import Config, gunicorn_value

log = logging.getLogger("refork")

BOOTING = "[booting]"
"""`worker.pid` before the fork (in `pre_fork`), as gunicorn shows it."""


class GunicornConfig:
    """`server.cfg` / `worker.cfg`: the resolved config, readable by refork's names and gunicorn's.

    `cfg.workers`, `cfg.bind` are refork's settings (same names as gunicorn's); `cfg.accesslog`,
    `cfg.errorlog`, `cfg.loglevel`, `cfg.worker_class`, `cfg.preload_app`... answer what refork
    does for gunicorn's setting of that name (refork.config.gunicorn's table).
    """

    __slots__ = ("_config",)

    def __init__(self, config: Config) -> None:
        object.__setattr__(self, "_config", config)

    def __getattr__(self, name: str) -> Any:
        config = object.__getattribute__(self, "_config")
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return getattr(config, name)
        except AttributeError:
            pass
        found, value = gunicorn_value(config, name)
        if not found:
            raise AttributeError(f"No configuration setting for: {name}")
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Invalid access!")  # gunicorn's Config is read-only to hooks too

    @property
    def env(self) -> dict[str, str]:
        """raw_env as a dict (gunicorn's `cfg.env`)."""
        config = object.__getattribute__(self, "_config")
        return dict(item.split("=", 1) for item in config.raw_env)

    def __repr__(self) -> str:
        return f"<refork config for {object.__getattribute__(self, '_config').app!r}>"


class Server:
    """The `server` argument: the monitor, as a hook sees it.

    In the monitor (on_starting, when_ready, on_reload, child_exit, nworkers_changed, on_exit) it
    is live: `num_workers` follows TTIN/TTOU and reloads. In a mold or worker (pre_fork, post_fork,
    worker_exit, pre_promotion) it is that process's copy: `num_workers` as of its fork.
    """

    def __init__(self, config: Config, pid: int, num_workers: int | None = None) -> None:
        self.config = config
        self.cfg = GunicornConfig(config)
        self.log = log
        self.pid = pid
        self.num_workers = config.workers if num_workers is None else num_workers

    @property
    def proc_name(self) -> str:
        return self.config.proc_name

    @property
    def address(self) -> list[tuple[str, int] | str | int]:
        """gunicorn's shape: (host, port) for TCP, the path for unix, the number for fd://N."""
        return [gunicorn_address(text) for text in self.config.bind]

    @property
    def timeout(self) -> float:
        return self.config.timeout

    def __repr__(self) -> str:
        return f"<refork server pid={self.pid} workers={self.num_workers}>"


class Worker:
    """The `worker` argument: one worker process (or, in child_exit, one that exited).

    pid: its pid (`"[booting]"` in pre_fork, before it exists); ppid: the monitor's pid (gunicorn's
    master; a worker's real parent is the monitor too, the subreaper of every child); age: a
    number the monitor gives each worker it asks for, increasing (gunicorn's spawn counter);
    nr: its place in the worker count (0..workers-1); generation: the mold it came from; alive:
    False once it was told to stop; app / wsgi: the app callable (in the worker); status: the wait
    status in child_exit; role: "worker", or "mold" in child_exit for a mold.
    """

    def __init__(
        self,
        config: Config,
        *,
        pid: int | str,
        ppid: int,
        age: int = 0,
        nr: int = -1,
        generation: int = 0,
        app: Any = None,
        alive: Callable[[], bool] | None = None,
        status: int | None = None,
        role: str = "worker",
    ) -> None:
        self.config = config
        self.cfg = GunicornConfig(config)
        self.log = log
        self.pid = pid
        self.ppid = ppid
        self.age = age
        self.nr = nr
        self.generation = generation
        self.app = self.wsgi = app
        self.status = status
        self.role = role
        self.booted = pid != BOOTING and status is None
        self.aborted = False
        self.timeout = config.timeout
        self.max_requests = config.max_requests
        self._alive = alive

    @property
    def alive(self) -> bool:
        if self._alive is not None:
            return self._alive()
        return self.status is None and self.pid != BOOTING

    def notify(self) -> None:
        """gunicorn's heartbeat: refork's workers report through a shared page; nothing to do."""

    def __repr__(self) -> str:
        return f"<Worker {self.pid}>"


_current: Worker | None = None


def this_worker() -> Worker | None:
    """The `worker` object of the worker process we are in (None in the monitor or a mold)."""
    return _current


def become(worker: Worker | None) -> None:
    """Make `worker` this process's worker object (a new worker, right after its fork)."""
    global _current
    _current = worker


def call(config: Config, name: str, *args: Any) -> Any:
    """Run the config file's hook `name` with gunicorn's arguments, if there is one (None if not).

    Its exception propagates: the caller decides (the monitor logs it and carries on).
    """
    hook = config.hooks.get(name)
    if hook is None:
        return None
    return hook(*args)


def call_logged(config: Config, name: str, *args: Any) -> None:
    """Run a hook whose failure must not stop the process: its exception is logged."""
    try:
        call(config, name, *args)
    except Exception:
        log.exception("the %s hook raised; carrying on", name)


def call_warned(config: Config, name: str, *args: Any) -> None:
    """Run a hook on the way out (worker_exit): its exception is a WARNING with its traceback, as
    gunicorn's, and the process still exits as it was going to."""
    try:
        call(config, name, *args)
    except Exception:
        log.warning("the %s hook raised; exiting all the same", name, exc_info=True)


def worker_for_exit(config: Config, pid: int, role: str, nr: int, generation: int, age: int,
                    status: int) -> Worker:  # fmt: skip
    """The `worker` object child_exit gets in the monitor for a reaped child."""
    return Worker(config, pid=pid, ppid=os.getpid(), age=age, nr=nr, generation=generation, status=status,
                  role=role)  # fmt: skip
