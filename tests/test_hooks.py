"""Config-file hooks in the monitor: when they run, and that a raising one never stops it."""

from __future__ import annotations

import os
import signal

HOOKS = '''
import os
_LOG = {log!r}

def _note(*words):
    with open(_LOG, "a") as f:
        f.write(" ".join(str(w) for w in words) + "\\n")

def on_starting(config):
    _note("on_starting", config.workers)

def when_ready(config):
    _note("when_ready")

def child_exit(config, child):
    _note("child_exit", child["role"], child["nr"])
    raise RuntimeError("a broken child_exit hook")

def on_reload(config):
    _note("on_reload", config.workers)

def on_exit(config):
    _note("on_exit")
'''


def test_monitor_hooks_run_and_a_raising_one_is_logged(start_server, tmp_path):
    log = tmp_path / "hooks.log"
    conf = tmp_path / "refork.conf.py"
    conf.write_text(HOOKS.format(log=str(log)) + "workers = 1\n")
    server = start_server("-c", str(conf), workers=None)
    victim = server.workers()[0]
    os.kill(victim["pid"], signal.SIGKILL)
    server.wait_for(lambda: [w for w in server.workers() if w["pid"] != victim["pid"]], what="a replacement")
    assert "the child_exit hook raised; carrying on" in server.log()
    assert "RuntimeError: a broken child_exit hook" in server.log()
    conf.write_text(HOOKS.format(log=str(log)) + "workers = 2\n")
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: server.status()["generation"] == 1 and len(server.workers()) == 2, what="reload")
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    lines = log.read_text().splitlines()
    assert lines[:4] == ["on_starting 1", "when_ready", "child_exit worker 0", "on_reload 2"]
    assert lines[-1] == "on_exit"
