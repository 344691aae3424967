"""Hooks that hang or raise: the monitor's run beside its loop under a deadline (--graceful-timeout,
here 1 s), so it serves, replaces and stops while one hangs; a worker names the hook it hangs in;
a raising worker_exit is a warning and a clean exit, as in gunicorn."""

from __future__ import annotations

import os
import signal
import time

from support.waits import wait_for_line

HANG = """
import os, time
_LOG = {log!r}

def _note(*words):
    with open(_LOG, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\\n")

def {hook}(server, *args):
    _note("{hook}", os.getpid())
    time.sleep(3600)
"""


def _hanging(tmp_path, *hooks: str) -> tuple[str, object]:
    log = tmp_path / "hooks.log"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("".join(HANG.format(log=str(log), hook=hook) for hook in hooks))
    return str(conf), log


def _replace(server, victim: int, what: str) -> None:
    os.kill(victim, signal.SIGKILL)
    server.wait_for(lambda: any(w["pid"] != victim for w in server.workers()), what=what)


def test_a_hanging_when_ready_and_on_exit_neither_stop_serving_nor_the_stop(start_server, tmp_path):
    conf, log = _hanging(tmp_path, "when_ready", "on_exit")
    server = start_server("-c", conf, "--graceful-timeout", "1", workers=1)
    wait_for_line(log, "when_ready")
    assert server.get("/")[0] == 200
    _replace(server, server.workers()[0]["pid"], "a replacement while when_ready hangs")
    assert server.get("/")[0] == 200
    server.wait_for(lambda: "hook when_ready has run for" in server.log(), what="the late hook's line")
    began = time.monotonic()
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=20) == 0
    took = time.monotonic() - began
    assert took < 1 + 1 + 3, took  # --graceful-timeout, the hook deadline, and the machine's load
    text = server.log()
    assert text.count("hook when_ready has run for") == 1
    assert "hook when_ready has run for 1 s; supervising on without it" in text
    assert "hook on_exit has run for 1 s; exiting without it" in text
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["when_ready", "on_exit"]


def test_a_hanging_child_exit_does_not_hold_back_replacements(start_server, tmp_path):
    conf, log = _hanging(tmp_path, "child_exit")
    server = start_server("-c", conf, "--graceful-timeout", "1", workers=1)
    for _ in range(2):  # the second call waits its turn behind the first, then gets its own thread
        _replace(server, server.workers()[0]["pid"], "a replacement while child_exit hangs")
        assert server.get("/")[0] == 200
    server.wait_for(lambda: log.read_text().count("child_exit") == 2, what="the second child_exit call")
    assert "hook child_exit has run for 1 s; supervising on without it" in server.log()
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=20) == 0


def test_a_worker_hanging_in_post_fork_is_killed_naming_the_hook(start_server, tmp_path):
    conf, _ = _hanging(tmp_path, "post_fork")
    server = start_server("-c", conf, "--spawn-timeout", "1", workers=1, wait=False)
    server.wait_for(lambda: "killing it" in server.log(), what="the spawn timeout")
    assert "did not become ready within 1s (still running the post_fork hook); killing it" in server.log()


RAISING_EXIT = """
def worker_exit(server, worker):
    raise RuntimeError("a broken worker_exit hook")
"""


def test_a_raising_worker_exit_is_a_warning_and_a_clean_exit(start_server, tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(RAISING_EXIT)
    server = start_server("-c", str(conf), workers=1)
    worker = server.workers()[0]["pid"]
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    text = server.log()
    assert f"[{worker}] [WARNING] the worker_exit hook raised; exiting all the same" in text
    assert "RuntimeError: a broken worker_exit hook" in text
    assert f"(pid {worker}, gen 0) exited with code 0" in text
    assert "unexpected error" not in text


COUNT = """
_LOG = {log!r}

def nworkers_changed(server, new_value, old_value):
    with open(_LOG, "a") as f:
        f.write(f"{{new_value}} {{old_value}} {{server.num_workers}}\\n")
"""


def test_nworkers_changed_follows_ttin_and_ttou(start_server, tmp_path):
    log = tmp_path / "count.log"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(COUNT.format(log=str(log)))
    server = start_server("-c", str(conf), workers=1)
    server.signal(signal.SIGTTIN)
    server.wait_ready(2)
    server.signal(signal.SIGTTOU)
    server.wait_for(lambda: log.read_text().count("\n") == 3, what="three nworkers_changed calls")
    assert log.read_text().splitlines() == ["1 None 1", "2 1 2", "1 2 1"]
