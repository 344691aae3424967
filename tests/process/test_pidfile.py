"""--pid FILE: written by the monitor, refused while held, replaced when stale, removed on exit."""

from __future__ import annotations

import signal

from conftest import run_cli


def test_pidfile_holds_the_monitor_pid_and_goes_away_on_stop(start_server, tmp_path):
    pidfile = tmp_path / "refork.pid"
    server = start_server("--pid", str(pidfile), workers=1)
    assert pidfile.read_text() == f"{server.proc.pid}\n"
    second = run_cli(  # its own control socket: the default one may be another server's
        "--pid", str(pidfile), "-b", "127.0.0.1:0", "--control-socket", str(tmp_path / "ctl"),
        "apps.procs:app", "--chdir", "tests",
    )  # fmt: skip
    assert second.returncode == 2
    assert second.stderr.strip() == (
        f"refork: error: --pid {pidfile}: pid {server.proc.pid} is running and holds it; "
        "stop that server, or give another file"
    )
    assert pidfile.read_text() == f"{server.proc.pid}\n"  # the refused start left it alone
    server.signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    assert not pidfile.exists()


def test_a_stale_pidfile_is_replaced(start_server, tmp_path):
    pidfile = tmp_path / "refork.pid"
    pidfile.write_text("4194304\n")  # above the kernel's pid_max: never a live process
    server = start_server("--pid", str(pidfile), workers=1)
    assert pidfile.read_text() == f"{server.proc.pid}\n"


def test_a_pidfile_in_a_missing_directory_is_one_line(tmp_path):
    result = run_cli("--pid", str(tmp_path / "no" / "refork.pid"), "-b", "127.0.0.1:0", "apps.procs:app",
                     "--chdir", "tests")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"refork: error: --pid {tmp_path}/no/refork.pid: No such file or directory; "
        "check that its directory exists and is writable"
    )
