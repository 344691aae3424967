"""HUP re-reads the config: real servers, a real config file, real signals."""

from __future__ import annotations

import os
import signal

from conftest import run_cli
from support.load import Load

LONG_PATH = "/" + "x" * 300


def reloaded_to(server, generation: int, workers: int) -> bool:
    every = server.workers(state=None)
    return (
        server.status()["generation"] == generation
        and len(every) == workers
        and all(w["generation"] == generation and w["state"] == "ready" for w in every)
    )


def test_hup_rereads_the_config_file_and_applies_it_with_the_new_generation(start_server, tmp_path):
    conf = tmp_path / "refork.conf.py"
    conf.write_text("workers = 1\nlimit_request_line = 8190\n")
    server = start_server("-c", str(conf), workers=None)
    assert server.get(LONG_PATH)[0] == 200
    conf.write_text("workers = 2\nlimit_request_line = 100\nproc_name = 'renamed'\n")
    with Load(server.port, threads=2) as load:
        load.wait_until_warm()
        server.signal(signal.SIGHUP)
        server.wait_for(lambda: reloaded_to(server, 1, 2), timeout=30, what="gen 1 with two workers")
    assert load.failures == []
    assert server.status()["workers"] == 2
    assert server.get(LONG_PATH)[0] == 414  # the new limit reached the new workers
    log = server.log()
    assert "reload: config changed: workers, limit_request_line (applied when the new mold is ready)" in log
    assert "reload: proc_name changed ('refork' -> 'renamed') but takes a restart; keeping 'refork'" in log
    with open(f"/proc/{server.workers()[0]['pid']}/cmdline", "rb") as f:
        assert f.read().startswith(b"refork: worker")


def test_hup_with_a_broken_config_changes_nothing(start_server, tmp_path):
    conf = tmp_path / "refork.conf.py"
    conf.write_text("workers = 2\n")
    server = start_server("-c", str(conf), workers=None)
    workers = {w["pid"] for w in server.wait_ready(2)}
    conf.write_text("workers = 'many'\n")
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: "nothing changed" in server.log(), what="the refused reload logged")
    conf.write_text("workers = 3\nraise RuntimeError('half-edited')\n")
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: "half-edited" in server.log(), what="the second refused reload logged")
    log = server.log()
    assert "reload: workers in " in log and "; nothing changed" in log
    assert "reload: the config file raised RuntimeError: half-edited; nothing changed" in log
    assert "Traceback" not in log
    assert server.status()["generation"] == 0
    assert {w["pid"] for w in server.workers()} == workers
    assert server.get("/")[0] == 200
    conf.write_text("workers = 1\n")
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: reloaded_to(server, 1, 1), timeout=30, what="a good reload to one worker")


def test_a_reload_whose_app_fails_keeps_the_old_config(start_server, tmp_path):
    conf, broken = tmp_path / "refork.conf.py", tmp_path / "broken"
    conf.write_text("workers = 1\n")
    server = start_server(
        "-c", str(conf), app="apps.reloadable:app", workers=None, env={"REFORK_TEST_BREAK": str(broken)}
    )
    conf.write_text("workers = 2\n")
    broken.write_text("1")
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: "failed to load the app" in server.log(), what="the failed reload logged")
    status = server.status()
    assert status["generation"] == 0 and status["workers"] == 1
    assert server.get("/")[0] == 200
    broken.unlink()
    server.signal(signal.SIGHUP)
    server.wait_for(lambda: reloaded_to(server, 1, 2), timeout=30, what="the good reload applied")


EDITED_APP = '''
def app(environ, start_response):
    body = b"{body}"
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
'''


def edit(path, text: str) -> None:
    """Write and move the mtime a second on: a pyc is trusted by (mtime in seconds, size)."""
    before = path.stat().st_mtime if path.exists() else 0
    path.write_text(text)
    os.utime(path, (before + 1, before + 1))


def test_reload_flag_reloads_when_a_watched_file_changes(start_server, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    module = src / "edited_app.py"
    edit(module, EDITED_APP.format(body="one"))
    server = start_server(
        "--reload", "--reload-dir", str(src), "--pythonpath", str(src), app="edited_app:app", workers=1
    )
    assert server.get("/") == (200, b"one")
    assert "--reload: watching 1 *.py files under" in server.log()
    edit(module, EDITED_APP.format(body="two"))
    server.wait_for(lambda: server.get("/") == (200, b"two"), what="the edited app served")
    assert f"--reload: {module} changed" in server.log()
    assert server.status()["generation"] == 1
    edit(module, "def app(:\n")  # a syntax error: the new mold fails, the running app stays
    server.wait_for(lambda: "failed to load the app" in server.log(), what="the failed reload logged")
    assert server.get("/") == (200, b"two")
    edit(module, EDITED_APP.format(body="three"))
    server.wait_for(lambda: server.get("/") == (200, b"three"), what="the fixed app served")


def test_watched_files_skip_caches_and_virtualenvs(tmp_path):
    from refork.process.watch import changed, snapshot

    for name in ("a.py", "pkg/b.py", ".venv/lib/c.py", "venv/d.py", "pkg/__pycache__/e.py", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    before = snapshot([str(tmp_path), str(tmp_path / "missing")])
    assert sorted(before) == [str(tmp_path / "a.py"), str(tmp_path / "pkg" / "b.py")]
    edit(tmp_path / "a.py", "x = 1\n")
    (tmp_path / "pkg" / "b.py").unlink()
    (tmp_path / "new.py").write_text("")
    after = snapshot([str(tmp_path)])
    assert changed(before, after) == sorted(str(tmp_path / n) for n in ("a.py", "new.py", "pkg/b.py"))
    assert changed(after, after) == []


def test_refork_reload_answers_whether_the_reload_started(start_server, tmp_path):
    conf = tmp_path / "refork.conf.py"
    conf.write_text("workers = 1\n")
    server = start_server("-c", str(conf), workers=None)
    conf.write_text("workers = 0\n")
    refused = run_cli("reload", "--control-socket", server.control)
    assert refused.returncode == 1
    assert refused.stdout.startswith(f"reload refused: workers in {conf} must be")
    assert refused.stdout.rstrip().endswith("; nothing changed")
    conf.write_text("workers = 2\n")
    started = run_cli("reload", "--control-socket", server.control)
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.startswith("reloading: a new mold is importing the app")
    server.wait_for(lambda: reloaded_to(server, 1, 2), timeout=30, what="gen 1 with two workers")
    more = run_cli("ttin", "--control-socket", server.control)
    assert more.returncode == 0 and server.status()["workers"] == 3
