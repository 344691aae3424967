"""gunicorn's configs and command lines, as real projects write them, start refork.

Each config file of tests/gunicorn_configs/ and each command line below is first shown to be
valid gunicorn 27 (gunicorn's own parser and validators accept it), then checked with
`refork --check-config` and started for real; a sample serves HTTP. Together they set every
gunicorn setting at least once; the table in refork.config.gunicorn has a row for each.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import trustme
from gunicorn.config import KNOWN_SETTINGS
from gunicorn.config import Config as GunicornConfig
from support import paths

from refork.config import build_parser, load_config
from refork.config.docs import GUNICORN_END, GUNICORN_PATH, GUNICORN_START, gunicorn_doc
from refork.config.gunicorn import BY_NAME, ROWS

TESTS = paths.TESTS
ROOT = TESTS.parent
CONFIGS = sorted(p.stem for p in (TESTS / "gunicorn_configs").glob("*.py") if p.stem != "__init__")
WSGI, ASGI = "apps.wsgi_apps:app", "apps.asgi_apps:app"

# Command lines from Procfiles, Dockerfiles and READMEs (APP last; PORT is the test's port).
COMMAND_LINES = {
    "heroku-procfile": f"--bind 0.0.0.0:$PORT {WSGI} --log-file -",
    "fastapi-uvicorn": f"-k uvicorn.workers.UvicornWorker -w 2 -b 127.0.0.1:$PORT {ASGI}",
    "uvicorn-worker-pkg": (
        f"-k uvicorn_worker.UvicornH11Worker --forwarded-allow-ips * --root-path /api {ASGI}"
    ),
    "gthread-tuned": (
        "-w 2 -k gthread --threads 4 -t 0 --keep-alive 5 --max-requests 1000 --max-requests-jitter 50 "
        "--graceful-timeout 10 --backlog 512 --access-logfile - "
        f"--access-logformat '%(h)s %(r)s %(s)s' {WSGI}"
    ),
    "django-docker": (
        "--preload --worker-tmp-dir /dev/shm --capture-output --enable-stdio-inheritance "
        f"--log-level debug --error-logfile - --name mysite --pid $LOG_DIR/app.pid {WSGI}"
    ),
    "gevent": f"-k gevent --worker-connections 100 {WSGI}",
    "unlimited": f"--limit-request-line 0 --limit-request-fields 0 --limit-request-field_size 0 {WSGI}",
    "env-and-paths": f"-e FOO=1 --env BAR=2 -m 007 --chdir $TESTS --pythonpath $TESTS/apps -R {WSGI}",
    "misc-flags": (
        "--reuse-port --no-sendfile --initgroups --check-config --reload-engine auto --http-protocols h1 "
        "--proxy-protocol --proxy-allow-from 127.0.0.1 --statsd-host 127.0.0.1:8125 --statsd-prefix web "
        "--dogstatsd-tags env:test --enable-backlog-metric --log-syslog-facility user "
        f"--disable-redirect-access-to-syslog --no-control-socket {WSGI}"
    ),
    "egg-sync": f"-k egg:gunicorn#sync --worker-class gthread --threads 2 {WSGI}",
}


def _env(tmp_path: Path, port: int | str = 8000) -> dict[str, str]:
    (tmp_path / "templates").mkdir(exist_ok=True)
    (tmp_path / "templates" / "a.html").write_text("<p>hi</p>")
    (tmp_path / "logging.ini").write_text(LOGGING_INI)
    (tmp_path / "logging.json").write_text(json.dumps({"version": 1, "root": {"level": "INFO"}}))
    certs = tmp_path / "certs"
    if not certs.exists():
        certs.mkdir()
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(certs / "ca.pem"))
        cert = ca.issue_cert("127.0.0.1", "localhost")
        cert.cert_chain_pems[0].write_to_path(str(certs / "server.pem"))
        cert.private_key_pem.write_to_path(str(certs / "server.key"))
    return {
        "LOG_DIR": str(tmp_path),
        "CERT_DIR": str(certs),
        "APP_DIR": str(TESTS),
        "EXTRA_PATH": str(TESTS / "apps"),
        "PORT": str(port),
        "TESTS": str(TESTS),
        "WEB_CONCURRENCY": "2",
        "GUNICORN_BIND": f"127.0.0.1:{port}",
    }


LOGGING_INI = """\
[loggers]
keys=root
[handlers]
keys=console
[formatters]
keys=plain
[logger_root]
level=INFO
handlers=console
[handler_console]
class=StreamHandler
formatter=plain
args=(sys.stderr,)
[formatter_plain]
format=%(levelname)s %(message)s
"""


def _argv(name: str, env: dict[str, str]) -> list[str]:
    return shlex.split(_expand(COMMAND_LINES[name], env))


def _expand(text: str, env: dict[str, str]) -> str:
    for key, value in env.items():
        text = text.replace(f"${key}", value)
    return text


def _config_names(name: str) -> set[str]:
    namespace = runpy.run_path(str(TESTS / "gunicorn_configs" / f"{name}.py"))
    return {key for key in namespace if key in {s.name for s in KNOWN_SETTINGS}}


def _flag_names(argv: list[str]) -> set[str]:
    by_flag = {flag: s.name for s in KNOWN_SETTINGS for flag in (s.cli or [])}
    return {by_flag[word.split("=")[0]] for word in argv if word.split("=")[0] in by_flag}


# ---------------------------------------------------------------------------------------------
# The table against gunicorn itself


def test_the_table_has_every_gunicorn_setting_with_its_flags():
    assert [row.name for row in ROWS] == [s.name for s in KNOWN_SETTINGS]
    for s in KNOWN_SETTINGS:
        assert BY_NAME[s.name].flags == tuple(s.cli or ()), s.name


def test_every_gunicorn_flag_parses():
    parser = build_parser()
    for s in KNOWN_SETTINGS:
        for flag in s.cli or ():
            takes_value = (s.action or "store") in ("store", "append") and s.nargs is None
            argv = [flag, "1"] if takes_value else [flag]
            parser.parse_args([*argv, "m:app"])  # raises ConfigError for an unknown flag


def test_from_gunicorn_doc_is_current_and_lists_every_setting():
    text = Path(GUNICORN_PATH).read_text()
    start, end = text.index(GUNICORN_START), text.index(GUNICORN_END) + len(GUNICORN_END)
    assert text[start:end] == gunicorn_doc(), (
        "docs/from-gunicorn.md is stale: python -m refork.config --write-doc"
    )
    for s in KNOWN_SETTINGS:
        assert f"| `{s.name}` |" in text, s.name


def test_the_configs_and_command_lines_set_every_gunicorn_setting(tmp_path):
    env = _env(tmp_path)
    seen = {"config"}  # -c, in every test that starts a config file
    for name in CONFIGS:
        seen |= _config_names(name)
    for name in COMMAND_LINES:
        seen |= _flag_names(_argv(name, env))
    assert {s.name for s in KNOWN_SETTINGS} - seen == set()


# ---------------------------------------------------------------------------------------------
# Each is valid gunicorn


@pytest.fixture
def gunicorn_env(tmp_path, monkeypatch):
    env = _env(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.mark.parametrize("name", CONFIGS)
def test_gunicorn_accepts_the_config_file(name, gunicorn_env):
    cfg = GunicornConfig()
    for key, value in runpy.run_path(str(TESTS / "gunicorn_configs" / f"{name}.py")).items():
        if key in cfg.settings:
            cfg.set(key, value)


@pytest.mark.parametrize("name", COMMAND_LINES)
def test_gunicorn_accepts_the_command_line(name, gunicorn_env):
    cfg = GunicornConfig()
    args = cfg.parser().parse_args(_argv(name, gunicorn_env))
    for key, value in vars(args).items():
        if key != "args" and value is not None:
            cfg.set(key, value)


# ---------------------------------------------------------------------------------------------
# refork: loaded, checked, started


def _refork(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("PORT", "WEB_CONCURRENCY")}
    return subprocess.run(
        [sys.executable, "-m", "refork", *args], capture_output=True, text=True, timeout=timeout, cwd=TESTS,
        env={**environ, **env, "REFORK_CONTROL_SOCKET": "off"},
    )  # fmt: skip


@pytest.mark.parametrize("name", CONFIGS)
def test_refork_check_config_accepts_the_config_file(name, tmp_path):
    env = _env(tmp_path)
    app = ASGI if name in ("fastapi_docker", "asgi_worker") else WSGI
    result = _refork("--check-config", "-c", f"python:gunicorn_configs.{name}", app, env=env)
    assert result.returncode == 0, result.stderr
    assert "config ok" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", COMMAND_LINES)
def test_refork_check_config_accepts_the_command_line(name, tmp_path):
    env = _env(tmp_path)
    argv = _argv(name, env)
    result = _refork("--check-config", *argv, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


SERVED = {"django_vm", "fastapi_docker", "gevent_chat", "tls_h2", "asgi_worker", "behind_proxy"}


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "privileges"])  # test_gunicorn_process starts it
def test_the_config_file_starts_refork(name, start_server, tmp_path):
    env = _env(tmp_path)
    env.pop("PORT")  # the fixture's --bind decides
    app = ASGI if name in ("fastapi_docker", "asgi_worker") else WSGI
    server = start_server(
        "-c", str(TESTS / "gunicorn_configs" / f"{name}.py"), app=app, workers=None, env=env
    )
    if name in SERVED:
        if name == "tls_h2":
            status = _https_status(server.port, Path(env["CERT_DIR"]) / "ca.pem")
        else:
            status = server.get("/")[0]
        assert status == 200, server.log()


def _https_status(port: int, ca: Path) -> int:
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status
    finally:
        conn.close()


@pytest.mark.parametrize(
    "name", ["heroku-procfile", "fastapi-uvicorn", "gthread-tuned", "gevent", "unlimited"]
)
def test_the_command_line_starts_refork_and_serves(name, start_server, tmp_path):
    env = _env(tmp_path)
    env.pop("PORT")
    argv = _argv(name, env)
    argv = [w for w in argv if w not in ("--bind", "-b") and not w.startswith("0.0.0.0:") and
            not w.startswith("127.0.0.1:")]  # fmt: skip
    *args, app = argv
    server = start_server(*args, app=app, workers=None, env=env)
    assert server.get("/")[0] == 200


# ---------------------------------------------------------------------------------------------
# What each one became


def test_fastapi_docker_config_and_uvicorn_worker(gunicorn_env, monkeypatch):
    monkeypatch.chdir(TESTS)
    monkeypatch.setenv("WEB_CONCURRENCY", "3")  # the config file reads it too
    monkeypatch.setenv("PORT", "9001")
    argv = ["-k", "uvicorn.workers.UvicornWorker", "-c", "python:gunicorn_configs.fastapi_docker", ASGI]
    config = load_config(argv, environ=dict(os.environ))
    assert (config.interface, config.workers, config.bind) == ("asgi", 3, ["0.0.0.0:9001"])
    assert (config.timeout, config.graceful_timeout, config.keepalive) == (120.0, 120.0, 5.0)
    assert config.access_logfile == "-" and config.error_logfile == "-"
    infos = [text for level, text in config.notes if level == logging.INFO]
    assert any("worker_tmp_dir" in text and "shared memory" in text for text in infos)
    assert not [text for level, text in config.notes if level >= logging.WARNING]  # helpers: quiet


def test_django_config_maps_gunicorn_names(gunicorn_env, tmp_path, monkeypatch):
    monkeypatch.chdir(TESTS)
    config = load_config(["-c", "python:gunicorn_configs.django_vm"], environ=gunicorn_env)
    assert config.app == WSGI
    assert (
        config.access_logfile == f"{tmp_path}/access.log" and config.error_logfile == f"{tmp_path}/error.log"
    )
    assert (config.limit_request_line, config.umask, config.proc_name) == (4094, 0o007, "mysite")
    assert config.raw_env == ["DJANGO_SETTINGS_MODULE=mysite.settings"]
    assert config.sources["access_logfile"] == "accesslog in python:gunicorn_configs.django_vm"
    assert {"on_starting", "post_fork", "pre_request", "post_request", "worker_abort"} <= set(config.hooks)
    infos = " ".join(text for level, text in config.notes if level == logging.INFO)
    assert "refork always preloads" in infos and "pre_exec" in infos


def test_gevent_runs_on_threads_with_one_warning(tmp_path):
    config = load_config(["-k", "gevent", "--worker-connections", "100", WSGI], environ={})
    assert config.threads == 64
    (warning,) = [text for level, text in config.notes if level == logging.WARNING]
    assert "does not monkey-patch" in warning and "64 threads per worker" in warning
    assert "worker_connections 100" in warning
    config = load_config(["-k", "eventlet", "--threads", "8", WSGI], environ={})
    assert config.threads == 8
    assert load_config(["-k", "gevent", WSGI], environ={}).threads == 32


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("spew = True\n", "refork has no --spew"),
        ("paste = 'production.ini'\n", "PasteDeploy"),
        ("protocol = 'uwsgi'\n", "uWSGI protocol"),
        ("dirty_workers = 2\n", "no dirty arbiter"),
        ("worker_class = 'aiohttp.GunicornWebWorker'\n", "worker class 'aiohttp.GunicornWebWorker'"),
        (
            "worker_class = 'geventwebsocket.gunicorn.workers.GeventWebSocketWorker'\n",
            "GeventWebSocketWorker",
        ),
    ],
)
def test_what_refork_cannot_do_is_one_line(body, needle, tmp_path):
    (tmp_path / "gunicorn.conf.py").write_text(body)
    result = subprocess.run(
        [sys.executable, "-m", "refork", "--chdir", str(TESTS), WSGI], capture_output=True, text=True,
        timeout=30, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("refork: error: ") and needle in lines[0], result.stderr


def test_print_config_says_where_each_value_came_from(tmp_path):
    (tmp_path / "gunicorn.conf.py").write_text("accesslog = '-'\nworkers = 3\nloglevel = 'debug'\n")
    env = {"GUNICORN_CMD_ARGS": "--timeout 60 --keep-alive 4", "WEB_CONCURRENCY": "5", "PORT": "9000",
           "REFORK_THREADS": "2"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "refork", "--print-config", "--max-requests", "9", WSGI],
        capture_output=True, text=True, timeout=30, cwd=tmp_path, env={**os.environ, **env},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    where = {line.split(" = ")[0]: line.rsplit("  # ", 1)[1] for line in result.stdout.splitlines()}
    assert where["access_logfile"] == "accesslog in gunicorn.conf.py"
    assert where["log_level"] == "loglevel in gunicorn.conf.py"
    assert where["workers"] == "workers in gunicorn.conf.py"  # the file wins over WEB_CONCURRENCY
    assert where["bind"] == "PORT"
    assert where["timeout"] == "GUNICORN_CMD_ARGS --timeout"
    assert where["keepalive"] == "GUNICORN_CMD_ARGS --keepalive"
    assert where["threads"] == "REFORK_THREADS"
    assert where["max_requests"] == "--max-requests"
    assert where["backlog"] == "default"


def test_gunicorn_conf_py_is_read_by_default_and_python_module_form(tmp_path, monkeypatch):
    (tmp_path / "gunicorn.conf.py").write_text("workers = 3\n")
    assert load_config([WSGI], environ={}, cwd=str(tmp_path)).workers == 3
    monkeypatch.syspath_prepend(str(TESTS))
    config = load_config(["-c", "python:gunicorn_configs.gevent_chat", WSGI], environ={}, cwd=str(tmp_path))
    assert (config.worker_class, config.timeout, config.bind) == ("gevent", 0.0, ["0.0.0.0:5000"])


@pytest.mark.parametrize(
    ("argv", "level", "needle"),
    [
        (["--strip-header-spaces"], logging.WARNING, "refuses a space before a header's colon"),
        (["--permit-obsolete-folding"], logging.WARNING, "refuses obsolete line folding"),
        (["--http2-cleartext", "prior-knowledge"], logging.WARNING, "add h2c to --http-protocols"),
        (["--header-map", "dangerous"], logging.WARNING, "drops headers with _"),
        (["--logger-class", "myapp.JsonLogger"], logging.WARNING, "logconfig_dict"),
        (["--preload"], logging.INFO, "refork always preloads"),
        (["--no-sendfile"], logging.INFO, "sendfile()"),
        (["--reload-engine", "inotify"], logging.INFO, "polls file times"),
        (["--statsd-host", "127.0.0.1:8125"], None, ""),  # glog's setting: a line only while it is missing
    ],
)
def test_what_refork_does_its_own_way_is_one_line_at_start(argv, level, needle):
    config = load_config([*argv, WSGI], environ={})
    if level is None:
        return
    (line,) = [(lvl, text) for lvl, text in config.notes]
    assert line[0] == level and needle in line[1] and line[1].startswith(argv[0] + ": ")


def test_defaults_of_gunicorn_need_no_line():
    config = load_config(["--header-map", "drop", "--http-protocols", "h2,h1", "--logger-class", "simple",
                          "--http2-cleartext", "off", WSGI], environ={})  # fmt: skip
    assert config.notes == []


def test_version_short_flag():
    result = subprocess.run([sys.executable, "-m", "refork", "-v"], capture_output=True, text=True,
                            timeout=30)  # fmt: skip
    assert result.returncode == 0 and result.stdout.startswith("refork ")
