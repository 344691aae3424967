"""Config-file hooks with gunicorn's arguments: which process runs each, what `server` and `worker`
offer, and that a raising monitor hook never stops the monitor."""

from __future__ import annotations

import os
import signal

HOOKS = """
import os
_LOG = {log!r}

def _note(*words):
    with open(_LOG, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\\n")

def on_starting(server):
    _note("on_starting", os.getpid(), server.pid, server.cfg.workers, server.num_workers)

def nworkers_changed(server, new_value, old_value):
    _note("nworkers_changed", os.getpid(), new_value, old_value)

def when_ready(server):
    _note("when_ready", os.getpid(), server.cfg.accesslog, server.cfg.preload_app)

def pre_fork(server, worker):
    _note("pre_fork", os.getpid(), worker.pid, worker.nr, worker.age)

def post_fork(server, worker):
    server.log.info("Worker spawned (pid: %s)", worker.pid)
    _note("post_fork", os.getpid(), worker.pid, worker.ppid, worker.alive, worker.nr, worker.age)

def post_worker_init(worker):
    _note("post_worker_init", os.getpid(), worker.pid, worker.cfg.timeout, callable(worker.wsgi))
    worker.log.info("worker %s initialised", worker.pid)

def worker_exit(server, worker):
    _note("worker_exit", os.getpid(), worker.pid, worker.alive)

def child_exit(server, worker):
    _note("child_exit", os.getpid(), worker.role, worker.nr, worker.pid)
    raise RuntimeError("a broken child_exit hook")

def on_reload(server):
    _note("on_reload", os.getpid(), server.cfg.workers)

def on_exit(server):
    _note("on_exit", os.getpid())
"""


def _lines(log, name):
    return [line.split()[1:] for line in log.read_text().splitlines() if line.split()[0] == name]


def test_gunicorn_hooks_run_in_their_processes_with_gunicorn_arguments(start_server, tmp_path):
    log = tmp_path / "hooks.log"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(HOOKS.format(log=str(log)) + "workers = 1\naccesslog = '-'\n")
    server = start_server("-c", str(conf), workers=None)
    assert server.get("/")[0] == 200
    monitor = str(server.proc.pid)
    victim = server.workers()[0]
    os.kill(victim["pid"], signal.SIGKILL)
    server.wait_for(lambda: [w for w in server.workers() if w["pid"] != victim["pid"]], what="a replacement")
    assert "the child_exit hook raised; carrying on" in server.log()
    assert "RuntimeError: a broken child_exit hook" in server.log()
    assert f"Worker spawned (pid: {victim['pid']})" in server.log()
    conf.write_text(HOOKS.format(log=str(log)) + "workers = 2\naccesslog = '-'\n")
    generation = server.status()["generation"]  # (a mold that crashes with an immortal heap: one more)
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: server.status()["generation"] == generation + 1 and len(server.workers()) == 2,
                    what="reload")  # fmt: skip
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0

    assert _lines(log, "on_starting") == [[monitor, monitor, "1", "1"]]
    assert _lines(log, "nworkers_changed") == [[monitor, "1", "None"], [monitor, "2", "1"]]
    assert _lines(log, "when_ready") == [[monitor, "-", "True"]]
    assert _lines(log, "on_reload") == [[monitor, "2"]]
    assert _lines(log, "on_exit") == [[monitor]]
    # pre_fork runs in a mold, before the worker exists; post_fork in the new worker
    pre_forks, post_forks = _lines(log, "pre_fork"), _lines(log, "post_fork")
    assert all(pid != monitor and wpid == "[booting]" for pid, wpid, _, _ in pre_forks)
    first = post_forks[0]
    assert first[:4] == [str(victim["pid"]), str(victim["pid"]), monitor, "True"]
    # a spawn counter, as gunicorn's (workers start side by side: their lines come in any order)
    ages = sorted(int(age) for *_, age in post_forks)
    assert len(set(ages)) == len(ages)
    assert [int(age) for *_, age in pre_forks] == ages  # the mold forks them one after another
    inits = _lines(log, "post_worker_init")
    assert inits[0] == [str(victim["pid"]), str(victim["pid"]), "30.0", "True"]
    # child_exit: in the monitor, with the exited worker (molds exit too: role "mold")
    exited = [line for line in _lines(log, "child_exit") if line[1] == "worker"]
    assert exited[0] == [monitor, "worker", "0", str(victim["pid"])]
    # worker_exit: in each worker that stopped gracefully (not the SIGKILLed one), no longer alive
    exits = _lines(log, "worker_exit")
    assert exits and all(pid == wpid and alive == "False" for pid, wpid, alive in exits)
    assert str(victim["pid"]) not in [pid for pid, _, _ in exits]


WORKER_INT = """
_LOG = {log!r}

def worker_int(worker):
    with open(_LOG, "a") as f:
        f.write(f"worker_int {{worker.pid}} {{worker.alive}}\\n")
"""


def test_worker_int_runs_in_the_worker_on_a_fast_stop(start_server, tmp_path):
    log = tmp_path / "int.log"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(WORKER_INT.format(log=str(log)))
    server = start_server("-c", str(conf), workers=2)
    pids = sorted(w["pid"] for w in server.workers())
    server.signal(signal.SIGINT)
    server.wait_exit()
    assert sorted(int(line.split()[1]) for line in log.read_text().splitlines()) == pids
    assert all(line.split()[2] == "False" for line in log.read_text().splitlines())


WORKER_ABORT = """
import sys, traceback
_LOG = {log!r}

def worker_abort(worker):
    stacks = "".join("".join(traceback.format_stack(frame)) for frame in sys._current_frames().values())
    with open(_LOG, "a") as f:
        f.write(f"worker_abort {{worker.pid}} {{worker.aborted}}\\n{{stacks}}")
"""


def test_worker_abort_runs_in_a_worker_past_its_timeout(start_server, tmp_path):
    """gunicorn's SIGABRT before the kill: the hook sees where the app is stuck."""
    log = tmp_path / "abort.log"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(WORKER_ABORT.format(log=str(log)))
    server = start_server("-c", str(conf), "--timeout", "1", workers=1)
    victim = server.workers()[0]["pid"]
    try:
        server.get("/sleep?30", timeout=15)
    except OSError:  # the connection dies with the worker
        pass
    server.wait_for(lambda: log.exists() and "worker_abort" in log.read_text(), what="the worker_abort hook")
    text = log.read_text()
    assert text.startswith(f"worker_abort {victim} True")
    assert "procs.py" in text  # the app's frame, where it is stuck
    server.wait_for(lambda: victim not in [w["pid"] for w in server.workers()], what="its replacement")
    assert "aborting it (SIGABRT)" in server.log()
