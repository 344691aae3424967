"""--http-protocols and the http2_* settings: from the CLI, a config file and the environment;
a bad value is one readable line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from refork.config import ConfigError, load_config


def test_default_offers_h2_by_alpn_and_h1(tmp_path):
    config = load_config(["m:app"], environ={}, cwd=str(tmp_path))
    assert config.http_protocols == ["h2", "h1"]
    assert (config.http2_max_concurrent_streams, config.http2_initial_window_size) == (100, 65535)
    assert (config.http2_max_frame_size, config.http2_max_header_list_size) == (16384, 65536)


@pytest.mark.parametrize(
    "source",
    ["cli", "file", "env"],
)
def test_http_protocols_from_every_source(tmp_path, source):
    args, environ = ["m:app"], {}
    if source == "cli":
        args = ["--http-protocols", "H2C, h1", "m:app"]
    elif source == "file":
        (tmp_path / "c.py").write_text("http_protocols = 'h2c,h1'\nhttp2_max_concurrent_streams = 7\n")
        args = ["-c", str(tmp_path / "c.py"), "m:app"]
    else:
        environ = {"REFORK_HTTP_PROTOCOLS": "h2c,h1"}
    config = load_config(args, environ=environ, cwd=str(tmp_path))
    assert config.http_protocols == ["h2c", "h1"]


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("h3", "unknown protocol 'h3'"),
        ("h1,h1", "names a protocol twice"),
        (",", "at least one of h1, h2, h2c"),
    ],
)
def test_bad_http_protocols_is_one_line(tmp_path, value, needle):
    with pytest.raises(ConfigError) as e:
        load_config(["--http-protocols", value, "m:app"], environ={}, cwd=str(tmp_path))
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--http2-max-frame-size", "1000"), ("--http2-initial-window-size", "3000000000"),
     ("--http2-max-concurrent-streams", "0")],
)
def test_bad_http2_limits(tmp_path, flag, value):
    with pytest.raises(ConfigError, match=flag.lstrip("-").replace("-", "[-_]")):
        load_config([flag, value, "m:app"], environ={}, cwd=str(tmp_path))


def test_cli_exit_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "refork", "--http-protocols", "spdy", "m:app"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown protocol 'spdy'" in proc.stderr
