"""The mold: imports and warms the app once, prepares its heap, then only forks workers.

A mold is either fresh (forked by the monitor, imports the app: generation 0, after HUP, or after
a mold crash) or promoted (a warm worker's double-forked child). Either way it ends in the same
loop: wait for a command, fork a worker, repeat. It never serves a request.
"""

from __future__ import annotations

import logging
import os
import select
import socket
from collections.abc import Callable
from functools import partial
from typing import Any

from refork import fork_safety, hooks, integrations, lifecycle
from refork.config import Config
from refork.errors import ConfigError
from refork.memory.heap import disable_gc_early, prepare_heap_for_fork
from refork.process import descriptors, fork_check, messages
from refork.process.context import ProcessContext, set_title
from refork.process.forking import Promoted, Unwind, fork_detached, reset_signals_in_child
from refork.process.worker import run_worker

log = logging.getLogger("refork")
CUT = (
    "it cut its copies (the worker it came from keeps its own), so code in its workers gets an error "
    "and reconnects instead of sharing the stream; close connections in a pre_promotion hook to avoid that"
)


def boot_mold(ctx: ProcessContext, generation: int) -> int:
    """A fresh mold: import the app, warm it, and serve as the mold of `generation`."""
    disable_gc_early()
    set_title(f"{ctx.config.proc_name}: mold (gen {generation})")
    cmd = ctx.register(messages.Spawned("mold", os.getpid(), generation))
    mode = ctx.config.fork_safety
    if mode != "off":  # what the monitor left open here is refork's, not the app's: quietly
        descriptors.make_harmless(_own_fds(ctx, cmd), "the mold", logging.DEBUG)
    phase = Phases(ctx)
    try:
        who = f"the mold (gen {generation})"
        app, interface, _ = load_checked(ctx.config, _own_fds(ctx, cmd), who, phase)
    except ConfigError as e:
        ctx.tell(messages.StartFailed(os.getpid(), phase.current, str(e), config_error=True))
        return 2
    except Exception as e:
        from refork.loading import app_traceback

        log.error("the app failed to load:\n%s", app_traceback(e))
        ctx.tell(messages.StartFailed(os.getpid(), phase.current, messages.last_line(e)))
        return 3
    except SystemExit as e:
        if isinstance(e, (Unwind, Promoted)) or e.code is None or isinstance(e.code, int):
            raise  # a plain exit code: the monitor names it ("exited with code N")
        # sys.exit("SECRET_KEY is not set"): the app's own message is the reason, as Python prints it
        log.error("the app exited while loading: %s", e.code)
        ctx.tell(messages.StartFailed(os.getpid(), phase.current, str(e.code)))
        return 1
    return _mold_loop(ctx, cmd, app, interface, generation)


class Phases:
    """Tells the monitor each phase of a start as it begins (where a crash happened, if one does)."""

    def __init__(self, ctx: ProcessContext) -> None:
        self.ctx = ctx
        self.current = messages.IMPORTING

    def __call__(self, name: str) -> None:
        self.current = name
        self.ctx.tell(messages.Starting(os.getpid(), name))


def promoted_mold(ctx: ProcessContext, app: Any, interface: str, generation: int) -> int:
    """A warm worker's child becomes the mold of `generation`."""
    disable_gc_early()
    reset_signals_in_child()
    fork_safety.reset()
    set_title(f"{ctx.config.proc_name}: mold (gen {generation})")
    cmd = ctx.register(messages.Spawned("mold", os.getpid(), generation))
    own = _own_fds(ctx, cmd)
    # HTTP clients the worker was serving (its copies, which the loop may not have closed yet)
    fork_check.cut(fork_check.client_connections(ctx.listeners, own))
    if ctx.config.fork_safety != "off":
        connections = fork_check.open_connections(own)
        try:
            fork_check.judge(connections, ctx.config.fork_safety, "the promoted mold", CUT)
        except ConfigError as e:
            ctx.tell(messages.StartFailed(os.getpid(), "checking fork safety", str(e)))
            return 3
        fork_check.cut(connections)
        # the worker's files, pipes and event loop: its own, quietly
        descriptors.make_harmless(own | lifecycle.kept_fds(), "the promoted mold", logging.DEBUG)
    integrations.after_promotion()  # forget the worker's pooled connection objects
    return _mold_loop(ctx, cmd, app, interface, generation)


def _own_fds(ctx: ProcessContext, cmd: socket.socket) -> set[int]:
    """refork's own descriptors in a mold."""
    return {cmd.fileno(), ctx.report.fileno(), *(sock.fileno() for sock in ctx.listeners)}


def load_checked(
    config: Config, own: set[int], who: str, phase: Callable[[str], None] = lambda name: None
) -> tuple[Any, str, list[fork_check.Hazard]]:
    """Import and warm the app as a mold does, then judge what a fork would still copy.

    Load-time connects and thread starts are traced; the fork integrations then close what the app
    opened at load, and what is left is judged by --fork-safety (strict raises ConfigError).
    `refork --check-config` runs exactly this, so the CI guard and the mold cannot disagree.
    """
    from refork.warmup import run_warmup

    for variable in integrations.prepare_environment(config.fork_integrations):
        log.debug("fork integrations: set %s before importing the app", variable)
    with fork_check.tracing(config.fork_safety) as tracer:
        phase(messages.IMPORTING)
        app, interface = _load(config)
        phase("warming up the app")
        run_warmup(app, interface, config)
    integrations.activate(config.fork_integrations)
    integrations.before_fork()  # what the app opened at load, closed before the check sees it
    threads = integrations.fork_safe_native_threads()
    hazards = fork_check.inspect(own, tracer, threads) if tracer is not None else []
    fork_check.judge(hazards, config.fork_safety, who)
    return app, interface, hazards


def _load(config: Config) -> tuple[Any, str]:
    from refork.loading import load_app, prepare_import_path, resolve_interface

    prepare_import_path(None, config.pythonpath)  # the monitor (or --check-config) did the chdir
    app = load_app(config.app)
    interface = resolve_interface(app, config.interface)
    # Import the connection loop here, once, so every worker shares it instead of importing it.
    if interface == "asgi":
        import refork.serving.asgi.server  # noqa: F401
    else:
        import refork.serving.wsgi.python_loop  # noqa: F401
    return app, interface


def _mold_loop(ctx: ProcessContext, cmd: socket.socket, app: Any, interface: str, generation: int) -> int:
    ctx.tell(messages.Starting(os.getpid(), messages.HEAP))
    report = prepare_heap_for_fork(immortalize=ctx.config.immortalize)
    detail = report.describe()
    log.info("mold (gen %d) ready; %s", generation, detail)
    immortal = report.immortalize.startswith("on ")  # (what it inherited may have been already)
    ctx.tell(messages.Ready(os.getpid(), detail, immortalized=immortal))
    children: set[int] = set()  # only without a subreaper: then workers are our children
    while True:
        if not ctx.subreaper:
            _reap_workers(ctx, children)
            ready, _, _ = select.select([cmd], [], [], 0.5)
            if not ready:
                continue
        try:
            received = messages.receive(cmd)
        except InterruptedError:
            continue
        if received is None:
            return 0  # the monitor is gone
        message, _ = received
        if isinstance(message, messages.Stop):
            # Without a subreaper an orphan's exit would reach no one, and the monitor would wait for
            # it to the end of its stop: the mold outlives its workers (being stopped too).
            _reap_workers(ctx, children, wait=True)
            return 0
        if isinstance(message, messages.ReopenLogs):
            from refork.logs import reopen_log_files

            reopen_log_files()
        elif isinstance(message, messages.SpawnWorker):
            try:
                pid = _fork_worker(ctx, cmd, app, interface, message)
            except Exception as e:  # a before_fork / pre_fork hook: no worker can come of this mold
                log.exception("the mold cannot fork a worker")
                phase = "running the pre_fork hooks"
                ctx.tell(messages.StartFailed(os.getpid(), phase, messages.last_line(e)))
                return 3
            if pid:
                children.add(pid)


def _fork_worker(
    ctx: ProcessContext, cmd: socket.socket, app: Any, interface: str, order: messages.SpawnWorker
) -> int:
    integrations.before_fork()
    lifecycle.run_hooks("before_fork")
    if "pre_fork" in ctx.config.hooks:
        config, monitor = ctx.config, ctx.monitor_pid
        worker = hooks.Worker(config, pid=hooks.BOOTING, ppid=monitor, age=order.age, nr=order.nr,
                              generation=order.generation, app=app)  # fmt: skip
        hooks.call(config, "pre_fork", hooks.Server(config, monitor), worker)
    descriptors.remember_before_fork()
    start = partial(_worker, ctx, app, interface, order)
    if ctx.subreaper:
        if fork_detached():
            cmd.close()
            raise Unwind(start)
        return 0
    pid = os.fork()
    if pid == 0:
        cmd.close()
        raise Unwind(start)
    return pid


def _worker(ctx: ProcessContext, app: Any, interface: str, order: messages.SpawnWorker) -> int:
    """The worker role, and its promotion: a worker's child raises Promoted to become the next mold."""
    try:
        return run_worker(ctx, app, interface, order.nr, order.generation, order.slot, order.age)
    except Promoted as promotion:
        generation = promotion.generation
    raise Unwind(partial(promoted_mold, ctx, app, interface, generation))


def _reap_workers(ctx: ProcessContext, children: set[int], wait: bool = False) -> None:
    """Report the exits of the mold's own workers (no subreaper); `wait`: until none is left."""
    while children:
        try:
            pid, status = os.waitpid(-1, 0 if wait else os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        ctx.tell(messages.WorkerExited(pid, status))
