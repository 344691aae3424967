"""Config loading: precedence of sources, the config file, validation messages."""

from __future__ import annotations

import logging
import textwrap

import pytest

from refork.config import (
    NOT_SETTINGS,
    RESTART_ONLY,
    SETTINGS,
    Config,
    ConfigError,
    cpu_quota,
    describe,
    idle_mold_linger,
    load_config,
    parse_size,
    reloaded,
)


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_every_field_but_hooks_notes_and_sources_is_a_setting():
    names = set(Config.__dataclass_fields__) - set(NOT_SETTINGS)
    assert names == {s.name for s in SETTINGS}


def test_defaults(tmp_path):
    c = load_config(["a:app"], environ={}, cwd=str(tmp_path))
    assert c == Config(app="a:app")


def test_precedence(tmp_path):
    """default < WEB_CONCURRENCY < pyproject < config file < env < CLI, one field at a time."""
    write(
        tmp_path / "pyproject.toml",
        """
        [tool.refork]
        workers = 3
        threads = 3
        max-requests = 3
        timeout = 3
        """,
    )
    write(
        tmp_path / "conf.py",
        """
        threads = 4
        max_requests = 4
        timeout = 4
        """,
    )
    env = {"WEB_CONCURRENCY": "2", "REFORK_MAX_REQUESTS": "5", "REFORK_TIMEOUT": "5"}
    c = load_config(["-c", "conf.py", "--timeout", "6", "a:app"], environ=env, cwd=str(tmp_path))
    assert (c.workers, c.threads, c.max_requests, c.timeout) == (3, 4, 5, 6.0)
    c = load_config(["a:app"], environ={"WEB_CONCURRENCY": "2"}, cwd=str(tmp_path / "nowhere"))
    assert c.workers == 2
    c = load_config(["a:app"], environ={}, cwd=str(tmp_path / "nowhere"))
    assert c.workers == 1


def test_env_lists_and_bools():
    env = {
        "REFORK_BIND": "127.0.0.1:8000,unix:/tmp/s",
        "REFORK_IMMORTALIZE": "0",
        "REFORK_MALLOC_TRIM": "yes",
        "REFORK_REFORK_AFTER": "500,1000,2000",
        "REFORK_MAX_WORKER_MEMORY": "512M",
        "REFORK_APP": "env:app",
        "REFORK_SOMETHING_INTERNAL": "ignored",
    }
    c = load_config([], environ=env)
    assert c.bind == ["127.0.0.1:8000", "unix:/tmp/s"]
    assert (c.immortalize, c.malloc_trim, c.app) == (False, True, "env:app")
    assert c.refork_after == [500, 1000, 2000]
    assert c.max_worker_memory == 512 * 1024 * 1024


def test_cli_flags():
    argv = [
        "-b", ":9000", "-b", "[::1]:9001", "--bind", "fd://3", "-w", "4", "--pythonpath", "a,b",
        "--pythonpath", "c", "--no-immortalize", "--warmup", "/", "--warmup", "/health",
        "--refork-after", "off", "-n", "web", "--limit-request-body", "1K", "--root-path", "/api/",
        "--log-level", "DEBUG", "--access-logfile", "-", "m:app",
    ]  # fmt: skip
    c = load_config(argv, environ={})
    assert c.bind == [":9000", "[::1]:9001", "fd://3"]
    assert c.workers == 4 and c.pythonpath == ["a", "b", "c"] and c.immortalize is False
    assert c.warmup == ["/", "/health"] and c.refork_after is None and c.proc_name == "web"
    assert c.limit_request_body == 1024 and c.root_path == "/api" and c.log_level == "debug"
    assert c.access_logfile == "-"


def test_workers_auto(monkeypatch):
    c = load_config(["-w", "auto", "m:app"], environ={})
    assert c.workers == cpu_quota() >= 1


def test_cpu_quota_cgroups(tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cpu_quota(str(tmp_path)) == min(2, cpu_quota("/nonexistent"))
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(str(tmp_path)) == cpu_quota("/nonexistent")
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_quota(str(v1)) == 1


def test_cpu_quota_is_the_smallest_from_the_own_cgroup_up(tmp_path):
    """A systemd unit's CPUQuota= is in its own cgroup's cpu.max, below the root's."""
    unit = tmp_path / "system.slice" / "web.service"
    unit.mkdir(parents=True)
    (unit / "cpu.max").write_text("100000 100000\n")
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cpu_quota(str(tmp_path), "/system.slice/web.service") == 1
    (unit / "cpu.max").write_text("max 100000\n")
    (tmp_path / "system.slice" / "cpu.max").write_text("250000 100000\n")
    assert cpu_quota(str(tmp_path), "/system.slice/web.service") == min(3, cpu_quota("/nonexistent"))
    assert cpu_quota(str(tmp_path), "/elsewhere") == cpu_quota("/nonexistent")


def test_config_file_hooks_and_names(tmp_path):
    path = write(
        tmp_path / "refork.conf.py",
        """
        import multiprocessing
        from os import environ
        _helper = 2
        workers = _helper * 2
        bind = ["unix:/tmp/x.sock"]
        globals()["max-requests"] = 7

        def post_fork(server, worker):
            pass

        def on_starting(server):
            pass
        """,
    )
    c = load_config(["-c", path, "m:app"], environ={})
    assert c.workers == 4 and c.bind == ["unix:/tmp/x.sock"] and c.max_requests == 7
    assert sorted(c.hooks) == ["on_starting", "post_fork"]
    assert "hooks = ['on_starting', 'post_fork']" in describe(c)


@pytest.mark.parametrize(
    "body, needle",
    [
        ("post_fork = 3\n", "server hook"),
        ("post_fork = lambda worker: None\n", "must take 2 argument(s) (server, worker)"),
        (
            "worker_class = 'aiohttp.GunicornWebWorker'\n",
            "cannot run worker class 'aiohttp.GunicornWebWorker'",
        ),
        ("workers = 'many'\n", "workers in "),
        ("workers = (\n", "(in config file)"),
    ],
)
def test_config_file_errors(tmp_path, body, needle):
    path = write(tmp_path / "c.py", body)
    with pytest.raises(ConfigError) as e:
        load_config(["-c", path, "m:app"], environ={})
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert path in msg


def test_unknown_config_names_are_ignored_and_likely_typos_named_once(tmp_path):
    """As gunicorn: names that are not settings are ignored; one WARNING lists the likely typos."""
    path = write(
        tmp_path / "c.py", "worker = 2\nBASE_DIR = '/srv'\npost_forks = lambda s, w: None\nworkers = 3\n"
    )
    config = load_config(["-c", path, "m:app"], environ={})
    assert config.workers == 3
    warnings = [text for level, text in config.notes if level == logging.WARNING]
    assert len(warnings) == 1
    assert "worker (did you mean 'workers'?)" in warnings[0]
    assert "post_forks (did you mean 'post_fork'?)" in warnings[0]
    assert "BASE_DIR" not in warnings[0]


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(["-c", "nope.py", "m:app"], environ={}, cwd=str(tmp_path))


def test_pyproject_unknown_key(tmp_path):
    write(tmp_path / "pyproject.toml", "[tool.refork]\nthread = 2\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'thread' .*did you mean 'threads'"):
        load_config(["m:app"], environ={}, cwd=str(tmp_path))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-w", "x"], '--workers must be a positive integer or "auto", got "x"'),
        (["-w", "0"], '--workers must be a positive integer or "auto", got 0'),
        (["--health-path", "/"], "--health-path must be a path of its own like /_refork/health, not '/'"),
        (["--health-path", "health"], "--health-path must start with '/', got \"health\""),
        (["--threads", "0"], "--threads must be a positive integer, got 0"),
        (["--timeout", "-1"], '--timeout must be a number of seconds (0 or "off": none)'),
        (["--graceful-timeout", "-1"], "--graceful-timeout must be a number of seconds >= 0"),
        (["--keepalive", "soon"], "--keepalive must be a number of seconds >= 0"),
        (["--interface", "wsgo"], "--interface must be one of auto|wsgi|asgi"),
        (["--loop", "trio"], "--loop must be one of auto|asyncio|uvloop"),
        (["-b", "local host"], "use HOST:PORT, [V6]:PORT, :PORT, unix:PATH or fd://N"),
        (["-b", "1.2.3.4:99999"], "is not a valid address"),
        (["-b", "fd://x"], "is not a valid address"),
        (["--access-log-format", "apache"], "--access-log-format: no atom in \"apache\" (gunicorn's atoms"),
        (["--log-level", "loud"], "--log-level must be one of debug|info|warning|error|critical"),
        (["--refork-after", "10,x"], "--refork-after must be request counts like 500,1000,2000"),
        (["--max-worker-memory", "12Q"], "--max-worker-memory must be a size in bytes like"),
        (["--memory-metric", "rss"], "--memory-metric must be one of uss|pss"),
        (["--forwarded-allow-ips", "10.0.0.0/99"], "is not an address, a network"),
        (["--warmup", "health"], "--warmup must start with '/'"),
        (["--max-requests", "-1"], "--max-requests must be an integer >= 0"),
        (["--mold-idle-exit", "-1"], '--mold-idle-exit must be "auto", a number of seconds >= 0 or "off"'),
        (["--body-timeout", "0"], "--body-timeout must be a number of seconds > 0"),
        (["--body-min-rate", "-1"], "--body-min-rate must be a number >= 0"),
        (["--mold-idle-exit", "soon"], '--mold-idle-exit must be "auto", a number of seconds >= 0 or "off"'),
        (["--foo"], "unknown option --foo (see refork --help)"),
        (["--wrokers", "2"], "unknown option --wrokers (did you mean '--workers'?)"),
    ],
)
def test_validation_one_line(argv, message):
    with pytest.raises(ConfigError) as e:
        load_config(argv + ["m:app"], environ={})
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_env_errors_name_the_variable():
    with pytest.raises(ConfigError, match='REFORK_WORKERS must be a positive integer or "auto", got "x"'):
        load_config(["m:app"], environ={"REFORK_WORKERS": "x"})
    with pytest.raises(ConfigError, match="did you mean 'REFORK_THREADS'"):
        load_config(["m:app"], environ={"REFORK_THREAD": "2"})
    with pytest.raises(ConfigError, match="WEB_CONCURRENCY must be"):
        load_config(["m:app"], environ={"WEB_CONCURRENCY": "lots"})


def test_missing_app():
    with pytest.raises(ConfigError, match=r"refork \[OPTIONS\] module:app"):
        load_config([], environ={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1048576", 1 << 20),
        ("0", 0),
        ("300k", 300 * 1024),
        ("300K", 300 * 1024),
        ("512M", 512 << 20),
        ("512MiB", 512 << 20),
        ("512mb", 512 << 20),
        ("1G", 1 << 30),
        ("1.5g", 3 << 29),
        (" 2T ", 2 << 40),
        ("64B", 64),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "-1G", "1X", "1.2.3M", "ten", "1 G B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match=r"invalid size .*e\.g\. 512M or 1G"):
        parse_size(text)


def test_the_defaults_refork_like_pitchfork_and_let_an_idle_mold_go():
    config = load_config(["m:app"], environ={})
    assert (config.refork_after, config.mold_idle_exit) == ([50, 100, 1000, 0], "auto")
    assert idle_mold_linger("auto", 2) == 1.0 and idle_mold_linger("auto", 1) is None
    assert idle_mold_linger(30.0, 1) == 30.0 and idle_mold_linger(None, 4) is None


def test_mold_idle_exit_takes_auto_seconds_zero_or_off():
    for raw, expected in (("auto", "auto"), ("off", None), ("0", 0.0), ("0.00", 0.0), ("2.5", 2.5)):
        assert load_config(["--mold-idle-exit", raw, "m:app"], environ={}).mold_idle_exit == expected
    with pytest.raises(ConfigError, match="REFORK_MOLD_IDLE_EXIT"):
        load_config(["m:app"], environ={"REFORK_MOLD_IDLE_EXIT": "x"})


def test_body_and_write_timeouts_are_their_own_not_the_worker_timeout():
    config = load_config(["--timeout", "5", "m:app"], environ={})
    assert (config.body_timeout, config.body_min_rate, config.write_timeout) == (30.0, 500.0, 30.0)
    config = load_config(["--body-timeout", "2.5", "--body-min-rate", "0", "--write-timeout", "2.5", "m:app"],
                         environ={})  # fmt: skip
    assert (config.body_timeout, config.body_min_rate, config.write_timeout) == (2.5, 0.0, 2.5)


def test_describe_is_name_value_lines():
    text = describe(Config(app="m:app"))
    assert any(line.startswith("app = 'm:app'  ") for line in text.splitlines())
    assert all(" = " in line and "  # " in line for line in text.splitlines())


def test_refork_after_can_end_in_off():
    assert load_config(["--refork-after", "30,60,off", "a:b"]).refork_after == [30, 60, 0]
    assert load_config(["--refork-after", "off", "a:b"]).refork_after is None


def test_reloaded_keeps_restart_only_settings_and_names_what_changed(tmp_path):
    (tmp_path / "conf.py").write_text(
        "workers = 2\nbind = ['127.0.0.1:9']\ndef post_fork(server, worker): pass\n"
    )
    current = load_config(["a:app"], environ={}, cwd=str(tmp_path))
    fresh = load_config(["-c", "conf.py", "--timeout", "7", "a:app"], environ={}, cwd=str(tmp_path))
    config, changed, kept = reloaded(current, fresh)
    assert changed == ["workers", "timeout"] and kept == ["bind"]
    assert config.bind == current.bind and config.workers == 2 and config.timeout == 7.0
    assert set(config.hooks) == {"post_fork"}
    assert all(getattr(config, name) == getattr(current, name) for name in RESTART_ONLY)
    assert reloaded(current, current)[1:] == ([], [])


def test_umask_007_is_octal_on_the_command_line_and_refused_in_a_file(tmp_path):
    """gunicorn's two readings: its -m flag takes a leading 0 as octal (auto_int); its config file
    validator does int(text, 0), which refuses "007"."""
    assert load_config(["-m", "007", "a:app"], environ={}, cwd=str(tmp_path)).umask == 0o7
    conf = write(tmp_path / "gunicorn.conf.py", "umask = '007'\n")
    with pytest.raises(ConfigError, match="write 0o007 for octal"):
        load_config(["-c", conf, "a:app"], environ={}, cwd=str(tmp_path))
    conf = write(tmp_path / "gunicorn.conf.py", "umask = '0o007'\n")
    assert load_config(["-c", conf, "a:app"], environ={}, cwd=str(tmp_path)).umask == 0o7


@pytest.mark.parametrize("entries", [[""], ["A=1", " "], ["FOO"], ["=x"]])
def test_raw_env_entries_that_are_not_assignments_are_refused(tmp_path, entries):
    with pytest.raises(ConfigError, match="must be KEY=VALUE"):
        load_config([*(f"--env={e}" for e in entries), "a:app"], environ={}, cwd=str(tmp_path))
