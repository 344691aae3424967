"""The settings table is the one source: flags, env names, help, checks and the docs are derived from it."""

from __future__ import annotations

import os
import subprocess
import sys
import typing

import pytest
from support import paths

from refork.config import SETTINGS, Config, build_parser, load_config
from refork.config.coercers import Choice
from refork.config.docs import DOC_END, DOC_PATH, DOC_START, options_doc

ROOT = str(paths.ROOT)

# One raw value per setting, as an environment variable or a flag would carry it, and what it becomes.
# A new setting fails test_every_setting_has_a_sample until it is given one here.
SAMPLES: dict[str, tuple[str, object]] = {
    "app": ("m:app", "m:app"),
    "health_path": ("/_refork/health", "/_refork/health"),
    "static": ("/static/=staticfiles", ["/static=staticfiles"]),
    "static_max_age": ("3600", 3600),
    "static_follow_symlinks": ("true", True),
    "ready_when": ("started", "started"),
    "shutdown_delay": ("2.5", 2.5),
    "interface": ("ASGI", "asgi"),
    "chdir": ("/srv", "/srv"),
    "pythonpath": ("a,b", ["a", "b"]),
    "root_path": ("/api/", "/api"),
    "bind": ("unix:/tmp/a.sock", ["unix:/tmp/a.sock"]),
    "backlog": ("64", 64),
    "metrics_bind": ("127.0.0.1:9101", "127.0.0.1:9101"),
    "metrics_buckets": ("0.1,1,10", [0.1, 1.0, 10.0]),
    "statsd_host": ("localhost:9125", "localhost:9125"),
    "proxy_protocol": ("v2", "v2"),
    "proxy_allow_ips": ("10.0.0.0/8,192.0.2.1", ["10.0.0.0/8", "192.0.2.1"]),
    "statsd_prefix": ("web", "web"),
    "dogstatsd_tags": ("env:prod", "env:prod"),
    "forwarded_allow_ips": ("10.0.0.0/8", ["10.0.0.0/8"]),
    "forwarded_client": ("ON", "on"),
    "workers": ("3", 3),
    "threads": ("4", 4),
    "switch_interval": ("0.02", 0.02),
    "timeout": ("7.5", 7.5),
    "graceful_timeout": ("8", 8.0),
    "keepalive": ("2", 2.0),
    "header_timeout": ("3", 3.0),
    "body_timeout": ("6", 6.0),
    "write_timeout": ("9", 9.0),
    "body_min_rate": ("250", 250.0),
    "spawn_timeout": ("4", 4.0),
    "max_requests": ("100", 100),
    "max_requests_jitter": ("10", 10),
    "proc_name": ("web", "web"),
    "control_socket": ("/tmp/web.ctl", "/tmp/web.ctl"),
    "pidfile": ("/tmp/web.pid", "/tmp/web.pid"),
    "loop": ("asyncio", "asyncio"),
    "wsgi_loop": ("python", "python"),
    "ws": ("none", "none"),
    "ws_max_size": ("1M", 1 << 20),
    "ws_per_message_deflate": ("false", False),
    "ws_ping_interval": ("off", None),
    "ws_ping_timeout": ("5", 5.0),
    "ws_drain_timeout": ("600", 600.0),
    "ws_max_queue": ("8", 8),
    "ws_max_memory": ("128M", 128 << 20),
    "ws_write_limit": ("16K", 16384),
    "certfile": ("cert.pem", "cert.pem"),
    "keyfile": ("key.pem", "key.pem"),
    "keyfile_password": ("secret", "secret"),
    "ca_certs": ("ca.pem", "ca.pem"),
    "cert_reqs": ("required", 2),
    "ciphers": ("ECDHE+AESGCM", "ECDHE+AESGCM"),
    "ssl_handshake_timeout": ("3", 3.0),
    "limit_request_line": ("100", 100),
    "limit_request_fields": ("10", 10),
    "limit_request_field_size": ("200", 200),
    "limit_request_body": ("1K", 1024),
    "http_protocols": ("h2c,h1", ["h2c", "h1"]),
    "http2_max_concurrent_streams": ("10", 10),
    "http2_initial_window_size": ("1048576", 1 << 20),
    "http2_max_frame_size": ("32768", 32768),
    "http2_max_header_list_size": ("16384", 16384),
    "body_spool_threshold": ("2M", 2 << 20),
    "max_spool": ("3G", 3 << 30),
    "max_request_memory": ("8M", 8 << 20),
    "spool_dir": ("/var/tmp", "/var/tmp"),
    "access_logfile": ("-", "-"),
    "access_log_format": ("json", "json"),
    "error_logfile": ("/tmp/err.log", "/tmp/err.log"),
    "log_level": ("debug", "debug"),
    "immortalize": ("off", False),
    "warmup": ("/health", ["/health"]),
    "refork_after": ("10,20", [10, 20]),
    "refork_max_unavailable": ("2", 2),
    "mold_idle_exit": ("5", 5.0),
    "request_timeout": ("2.5", 2.5),
    "fork_safety": ("strict", "strict"),
    "fork_integrations": ("redis,Django", ["django", "redis"]),
    "max_worker_memory": ("512M", 512 << 20),
    "memory_metric": ("pss", "pss"),
    "memory_interval": ("1", 1.0),
    "allocator": ("jemalloc", "jemalloc"),
    "malloc_trim": ("yes", True),
    "memray": ("/tmp/memray", "/tmp/memray"),
    "check_config": ("1", True),
    "print_config": ("1", True),
    "reload": ("true", True),
    "reload_dirs": ("/src", ["/src"]),
    "worker_class": ("gthread", "gthread"),
    "worker_connections": ("100", 100),
    "daemon": ("true", True),
    "user": ("0", "0"),
    "group": ("root", "root"),
    "initgroups": ("yes", True),
    "umask": ("022", 0o22),
    "raw_env": ("A=1", ["A=1"]),
    "reuse_port": ("1", True),
    "secure_scheme_headers": ("X-Scheme=https", {"X-SCHEME": "https"}),
    "reload_extra_files": ("/srv/templates/*.html", ["/srv/templates/*.html"]),
    "capture_output": ("true", True),
    "enable_stdio_inheritance": ("true", True),
    "logconfig": ("/etc/log.ini", "/etc/log.ini"),
    "logconfig_dict": ('{"version": 1}', {"version": 1}),
    "logconfig_json": ("/etc/log.json", "/etc/log.json"),
    "syslog": ("true", True),
    "syslog_addr": ("unix:///dev/log", "unix:///dev/log"),
    "syslog_prefix": ("web", "web"),
    "syslog_facility": ("local0", "local0"),
    "disable_redirect_access_to_syslog": ("true", True),
}


def test_every_setting_has_flags_env_help_and_a_check():
    assert {s.name for s in SETTINGS} == set(Config.__dataclass_fields__) - {"hooks", "notes", "sources"}
    for s in SETTINGS:
        assert s.flags and s.help and s.doc and callable(s.coerce), s.name
        assert s.env == f"REFORK_{s.name.upper()}"
        assert s.positional or all(f.startswith("-") for f in s.flags), s.name
        assert s.coerce(s.default, s.name) == s.default, f"{s.name}: its default must pass its own check"


def test_every_setting_has_a_sample():
    assert set(SAMPLES) == {s.name for s in SETTINGS}


def test_gunicorn_flag_names_are_kept():
    flags = {s.name: s.flags for s in SETTINGS}
    assert flags["bind"] == ("-b", "--bind") and flags["workers"] == ("-w", "--workers")
    assert flags["proc_name"] == ("-n", "--name") and flags["pidfile"] == ("-p", "--pid")
    assert flags["reload_dirs"] == ("--reload-dir",)


def test_help_lists_every_flag():
    text = build_parser().format_help()
    for s in SETTINGS:
        for flag in s.flags:
            assert flag in text, flag
    for flag in ("-c", "--config", "--version", "--no-immortalize", "--no-malloc-trim"):
        assert flag in text


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_env_sets_every_setting(name):
    raw, expected = SAMPLES[name]
    environ = {f"REFORK_{name.upper()}": raw}
    if name != "app":
        environ["REFORK_APP"] = "m:app"
    config = load_config([], environ=environ, cwd="/")
    assert getattr(config, name) == expected
    assert getattr(Config(), name) != expected, "pick a sample that differs from the default"


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_flag_sets_every_setting_like_env(name):
    setting = next(s for s in SETTINGS if s.name == name)
    raw, expected = SAMPLES[name]
    if setting.positional:
        argv = [raw]
    elif setting.action in ("store_true", "boolean_optional"):
        flag = setting.flags[-1]
        argv = [flag if expected else "--no-" + flag[2:], "m:app"]
    else:
        argv = [setting.flags[-1], raw, "m:app"]
    assert getattr(load_config(argv, environ={}, cwd="/"), name) == expected


def test_choices_come_from_the_literal_types():
    hints = typing.get_type_hints(Config)
    literal_fields = {name for name, hint in hints.items() if typing.get_origin(hint) is typing.Literal}
    assert literal_fields == {
        "interface", "loop", "log_level", "fork_safety", "memory_metric", "allocator",
        "ready_when", "wsgi_loop", "ws", "forwarded_client",
    }  # fmt: skip
    for s in SETTINGS:
        if s.name in literal_fields:
            assert isinstance(s.coerce, Choice)
            assert s.coerce.options == typing.get_args(hints[s.name])
            assert s.default in s.coerce.options


def test_docs_options_table_is_current():
    with open(DOC_PATH) as f:
        text = f.read()
    start, end = text.index(DOC_START), text.index(DOC_END) + len(DOC_END)
    assert text[start:end] == options_doc(), (
        "docs/configuration.md's options table is stale: run `python -m refork.config --write-doc`"
    )


def test_docs_table_has_a_row_per_setting():
    table = options_doc()
    for s in SETTINGS:
        assert f"`{s.env}`" in table


def test_config_does_not_import_cli_and_status_needs_no_config_object():
    code = (
        "import sys, refork.config, refork.status\n"
        "assert 'refork.cli' not in sys.modules, 'config must not import cli'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})


def test_status_finds_the_socket_from_name(tmp_path, monkeypatch, capsys):
    from refork import status

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert status.run(["status", "-n", "web"]) == 2
    assert f"no refork monitor at {tmp_path}/web.ctl" in capsys.readouterr().err
    assert status.run(["status", "--control-socket", str(tmp_path / "x.ctl")]) == 2
    assert f"{tmp_path}/x.ctl" in capsys.readouterr().err
