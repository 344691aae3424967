"""The refork command, run as `python -m refork` in a subprocess: exit codes and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support import paths

from refork import __version__
from refork.cli import main

TESTS = str(paths.TESTS)

ROOT = str(paths.ROOT)


def refork(*args: str, cwd: str | None = None, env: dict[str, str] | None = None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("REFORK_") and k != "WEB_CONCURRENCY"}
    environ["PYTHONPATH"] = ROOT
    environ.update(env or {})
    argv = [sys.executable, "-m", "refork", *args]
    return subprocess.run(argv, cwd=cwd, env=environ, capture_output=True, text=True, timeout=30)


def assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("refork: error: ")
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def project(tmp_path):
    (tmp_path / "hello.py").write_text(
        textwrap.dedent(
            """
            def app(environ, start_response):
                start_response("200 OK", [])
                return [b"hi"]

            async def asgi(scope, receive, send):
                pass

            def create_app(greeting="hi"):
                return app
            """
        )
    )
    (tmp_path / "broken.py").write_text("import refork_missing_dependency\napp = None\n")
    return tmp_path


def test_bad_option():
    r = refork("--foo", "m:app")
    assert_one_line_error(r, "unknown option --foo", "refork --help")


def test_mistyped_option_gets_a_suggestion():
    r = refork("--wrokers", "4", "m:app")
    assert_one_line_error(r, "unknown option --wrokers (did you mean '--workers'?)", "refork --help")


def test_bad_value():
    r = refork("-w", "x", "m:app")
    assert_one_line_error(r, '--workers must be a positive integer or "auto", got "x"')


def test_missing_app():
    assert_one_line_error(refork(), "refork [OPTIONS] module:app")


def test_missing_module(project):
    r = refork("--check-config", "nosuch:app", cwd=str(project))
    assert_one_line_error(r, "nosuch")


def test_missing_attribute(project):
    r = refork("--check-config", "hello:missing", cwd=str(project))
    assert_one_line_error(r, "missing", "create_app")


def test_check_config_ok(project):
    r = refork("--check-config", "hello:app", cwd=str(project))
    assert (r.returncode, r.stdout.strip()) == (0, "config ok: hello:app (wsgi)"), r.stderr
    r = refork("--check-config", "hello:asgi", cwd=str(project))
    assert r.stdout.strip() == "config ok: hello:asgi (asgi)", r.stderr
    r = refork("--check-config", "hello:create_app()", cwd=str(project))
    assert r.stdout.strip() == "config ok: hello:create_app() (wsgi)", r.stderr


def test_check_config_chdir(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    r = refork("--check-config", "--chdir", str(project), "hello:app", cwd=str(elsewhere))
    assert r.returncode == 0, r.stderr


def test_user_import_error_shows_traceback(project):
    r = refork("--check-config", "broken:app", cwd=str(project))
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "refork_missing_dependency" in r.stderr


def test_print_config(project):
    r = refork("--print-config", "-w", "3", "hello:app", env={"REFORK_THREADS": "2"})
    assert r.returncode == 0, r.stderr
    where = {line.split(" = ")[0]: line.rsplit("  # ", 1)[1] for line in r.stdout.splitlines()}
    value = {
        line.split(" = ")[0]: line.split(" = ", 1)[1].rsplit("  # ", 1)[0].strip()
        for line in r.stdout.splitlines()
    }
    assert (value["workers"], where["workers"]) == ("3", "--workers")
    assert (value["threads"], where["threads"]) == ("2", "REFORK_THREADS")
    assert (value["app"], where["app"]) == ("'hello:app'", "APP")
    assert where["timeout"] == "default"


def test_version():
    r = refork("--version")
    assert (r.returncode, r.stdout.strip()) == (0, f"refork {__version__}")


def test_subcommands_are_dispatched_before_parsing(monkeypatch):
    import types

    seen = []
    fake = types.ModuleType("refork.status")
    fake.run = lambda argv: seen.append(argv) or 7
    monkeypatch.setitem(sys.modules, "refork.status", fake)
    import refork

    monkeypatch.setattr(refork, "status", fake, raising=False)
    assert main(["status", "--json"]) == 7
    assert main(["refork", "--generation", "2"]) == 7
    assert seen == [["status", "--json"], ["refork", "--generation", "2"]]


def test_main_hands_config_to_monitor(monkeypatch):
    import types

    got = []
    fake = types.ModuleType("refork.process.monitor")
    fake.run = lambda config, reread: got.extend((config, reread())) or 0
    monkeypatch.setitem(sys.modules, "refork.process.monitor", fake)
    import refork.process

    monkeypatch.setattr(refork.process, "monitor", fake, raising=False)
    assert main(["-w", "2", "--chdir", str(TESTS), "apps.procs:app"]) == 0
    assert got[0].workers == 2 and got[0].app == "apps.procs:app"
    assert got[1] == got[0] and got[1] is not got[0]  # HUP builds it again from the same sources


def test_status_without_a_monitor_is_one_line(tmp_path):
    r = refork("status", "--control-socket", str(tmp_path / "none.ctl"))
    assert_one_line_error(r, "no refork monitor at", "none.ctl")


def test_forwarded_allow_ips_that_could_never_match_is_refused():
    r = refork("--forwarded-allow-ips", "127.0.0.1,localhost", "m:app")
    assert_one_line_error(r, "--forwarded-allow-ips", '"localhost"')
