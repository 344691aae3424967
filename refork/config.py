"""One configuration object, built from defaults, pyproject.toml, a config file, REFORK_* env and the CLI.

Precedence, lowest first: defaults, WEB_CONCURRENCY (workers only), ``[tool.refork]`` in
./pyproject.toml, the ``-c`` Python config file, ``REFORK_*`` environment variables, CLI flags.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class ConfigError(Exception):
    """A user mistake in configuration: printed as one line, exit status 2, no traceback."""


@dataclass
class Config:
    # What to serve
    app: str = ""
    interface: str = "auto"  # auto | wsgi | asgi
    chdir: str | None = None
    pythonpath: list[str] = field(default_factory=list)
    root_path: str = ""  # SCRIPT_NAME / ASGI root_path

    # Sockets
    bind: list[str] = field(default_factory=lambda: ["127.0.0.1:8000"])
    backlog: int = 2048
    forwarded_allow_ips: list[str] = field(default_factory=lambda: ["127.0.0.1", "::1"])

    # Processes
    workers: int = 1
    threads: int = 1
    timeout: float = 30.0  # a worker busy on one request longer than this is killed
    graceful_timeout: float = 30.0
    keepalive: float = 5.0  # idle keep-alive connection timeout
    header_timeout: float = 10.0  # time allowed to receive a complete request head
    spawn_timeout: float = 10.0  # a worker or promoted mold must report in within this
    max_requests: int = 0
    max_requests_jitter: int = 0
    proc_name: str = "refork"
    control_socket: str | None = None  # default: see refork.process.control.default_path
    loop: str = "auto"  # auto | asyncio | uvloop (ASGI)

    # HTTP limits
    limit_request_line: int = 8190
    limit_request_fields: int = 100
    limit_request_field_size: int = 8190
    limit_request_body: int = 1 << 30  # 0 = unlimited
    body_spool_threshold: int = 1 << 20  # larger request bodies go to a temp file

    # Logging
    access_logfile: str | None = None  # None = off, "-" = stdout
    access_log_format: str = "common"  # common | combined | json
    error_logfile: str = "-"  # "-" = stderr
    log_level: str = "info"

    # Memory (issue 3)
    immortalize: bool = True
    warmup: list[str] = field(default_factory=list)  # request paths sent through the app in the mold
    refork_after: list[int] | None = None  # None = off
    refork_max_unavailable: int | None = None  # None = ceil(10% of workers)
    max_worker_memory: int = 0  # bytes, 0 = off
    memory_metric: str = "uss"  # uss | pss
    memory_interval: float = 10.0  # seconds between smaps_rollup samples per process
    allocator: str = "system"  # system | jemalloc
    malloc_trim: bool = False
    memray: str | None = None  # directory for one memray capture per worker

    # Hooks (from the config file only): callables named like gunicorn's
    hooks: dict[str, Callable[..., Any]] = field(default_factory=dict)

    # Modes
    check_config: bool = False
    print_config: bool = False


HOOK_NAMES = (
    "on_starting",  # monitor, before the first mold: (config)
    "when_ready",  # monitor, after the first workers are ready: (config)
    "pre_fork",  # mold, before forking a worker: (config)
    "post_fork",  # worker, right after fork: (config, worker_info)
    "post_worker_init",  # worker, when ready to serve: (config, worker_info)
    "warmup",  # mold, after the app is imported and before the first fork: (app)
    "worker_exit",  # worker, before it exits: (config, worker_info)
    "child_exit",  # monitor, after a child was reaped: (config, child_info)
    "on_exit",  # monitor, before exit: (config)
)
