"""A start that cannot succeed ends with one line naming the cause and the phase (exit 3), and a
crash with an immortal heap falls back to a mold without immortalization. Real processes."""

from __future__ import annotations

import os
import re
import signal

import pytest
from conftest import run_cli

from refork.memory.heap import immortalize_support

APP = "apps.start_failures:app"
IMMORTALIZES = immortalize_support()[0]


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def test_an_app_that_segfaults_at_import_exits_3_naming_the_signal_and_the_phase():
    result = run_cli("-b", "127.0.0.1:0", "--chdir", "tests", APP, env={"REFORK_TEST_CRASH": "import"},
                     timeout=20)  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert last_line(result.stderr) == (
        "refork: error: no worker could start: the mold (gen 0) was killed by SIGSEGV while importing the app"
    )


def test_an_app_raising_at_import_exits_3_with_its_traceback_and_one_last_line():
    result = run_cli("-b", "127.0.0.1:0", "--chdir", "tests", "apps.broken_on_import:app")
    assert result.returncode == 3
    assert "Traceback" in result.stderr
    assert last_line(result.stderr) == (
        "refork: error: no worker could start: the mold (gen 0) failed while importing the app: "
        "RuntimeError: this app is broken at import time"
    )


@pytest.mark.parametrize(
    ("crash", "cause"),
    [("exit-message", "failed while importing the app: SECRET_KEY is not set"),
     ("exit-code", "exited with code 4 while importing the app")],
)  # fmt: skip
def test_an_app_exiting_at_import_exits_3_with_its_message_or_code_in_the_last_line(crash, cause):
    env = {"REFORK_TEST_CRASH": crash}
    result = run_cli("-b", "127.0.0.1:0", "--chdir", "tests", APP, env=env, timeout=20)
    assert result.returncode == 3, result.stderr
    assert last_line(result.stderr) == f"refork: error: no worker could start: the mold (gen 0) {cause}"


def test_a_post_fork_hook_that_always_raises_exits_3_naming_the_hook(tmp_path):
    conf = tmp_path / "conf.py"
    conf.write_text("def post_fork(server, worker):\n    raise RuntimeError('no database here')\n")
    result = run_cli("-b", "127.0.0.1:0", "-w", "2", "-c", str(conf), "--chdir", "tests", APP, timeout=30)
    assert result.returncode == 3, result.stderr
    assert last_line(result.stderr).startswith("refork: error: no worker could start: worker ")
    assert last_line(result.stderr).endswith(
        " failed while running the post_fork hook: RuntimeError: no database here"
    )


def test_a_server_that_has_served_backs_off_a_crash_loop_instead_of_exiting(start_server, tmp_path):
    marker = tmp_path / "broken"
    conf = tmp_path / "conf.py"
    conf.write_text(
        f"import os\n\ndef post_fork(server, worker):\n    if os.path.exists({str(marker)!r}):\n"
        "        os._exit(7)\n"
    )
    server = start_server("-c", str(conf), app=APP, workers=1)
    marker.touch()
    os.kill(server.workers()[0]["pid"], signal.SIGKILL)
    server.wait_for(lambda: server.log().count("exited with code 7") >= 3, what="three crashes")
    log = server.log()
    assert "crash loop" in log and server.proc.poll() is None
    marker.unlink()
    server.wait_ready(1, timeout=40)  # the back-off is at most a few seconds by then
    assert server.get("/")[0] == 200


@pytest.mark.skipif(not IMMORTALIZES, reason=f"no immortalization here: {immortalize_support()[1]}")
@pytest.mark.parametrize("where", ["mold", "worker"])
def test_a_crash_with_an_immortal_heap_falls_back_to_a_mold_without_it(start_server, where):
    # 4 workers: those the immortal mold forked before the first crash die too, and must
    # neither end the start (3 in a row would) nor be replaced from that mold
    server = start_server(app=APP, workers=4, env={"REFORK_TEST_CRASH": f"{where}-if-immortal"})
    code, body = server.get("/")
    assert code == 200 and body.endswith(b"immortal=False")
    log = server.log()
    assert log.count("with an immortal heap on Python") == 1, log
    assert "starting a new mold without immortalization" in log
    assert "immortalize off (--no-immortalize)" in log  # the new mold's heap line
    assert len(re.findall(r"gen 0\) was killed by SIGSEGV", log)) <= 4, log
