"""gunicorn's process and logging settings, for real: --daemon, --user/--group, --umask, syslog,
logconfig_dict, --log-config, --capture-output; and what a new user meets in the first minutes."""

from __future__ import annotations

import ast
import grp
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import free_port
from support import paths

import refork

TESTS = paths.TESTS
ROOT = TESTS.parent


def _run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run(
        [sys.executable, "-m", "refork", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def _wait(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _get(port: int) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status
    finally:
        conn.close()


def _uid(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("Uid:")).split()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


# ---------------------------------------------------------------------------------------------
# --daemon


def test_daemon_detaches_writes_its_pid_and_serves(tmp_path):
    port, pidfile = free_port(), tmp_path / "app.pid"
    started = _run(
        "-D", "-p", str(pidfile), "-b", f"127.0.0.1:{port}", "--control-socket", str(tmp_path / "c.ctl"),
        "--error-logfile", str(tmp_path / "error.log"), "--chdir", str(TESTS), "-w", "1", "apps.procs:app",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr  # the launching process returns at once
    assert started.stdout == "" and started.stderr == ""
    pid = _wait(lambda: pidfile.exists() and int(pidfile.read_text() or 0), "the pid file")
    try:
        assert pid != started.args and os.getsid(pid) != os.getsid(0)  # its own session
        _wait(lambda: "ready" in (tmp_path / "error.log").read_text(), "the server ready")
        assert _get(port) == 200
    finally:
        os.kill(pid, signal.SIGTERM)
        _wait(lambda: not _alive(pid), "the daemon to stop")
    assert not pidfile.exists()


# ---------------------------------------------------------------------------------------------
# --user / --group / --umask


def _others_can_read_the_checkout() -> None:
    """The app and refork are imported after the drop: an unprivileged user must reach them."""
    for folder in (ROOT, *ROOT.parents):
        mode = folder.stat().st_mode & 0o777
        if not mode & 0o001:
            pytest.fail(f"{folder} (mode {oct(mode)}) is closed to other users: clone refork elsewhere")


@pytest.fixture
def unprivileged():
    """A real unprivileged user and group (created if the machine has none): refork drops to it."""
    if os.geteuid() != 0:
        pytest.fail("the privilege tests run as root (as CI does)")
    _others_can_read_the_checkout()
    name = "refork-test"
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", name], check=True)
    return pwd.getpwnam(name), grp.getgrnam(name)


def test_user_and_group_drop_privileges_after_binding(start_server, tmp_path, unprivileged):
    user, group = unprivileged
    sock = tmp_path / "app.sock"
    server = start_server(
        "-u", user.pw_name, "-g", group.gr_name, "-m", "0o007", "-b", f"unix:{sock}",
        "--error-logfile", str(tmp_path / "error.log"), workers=2,
    )  # fmt: skip
    status = server.status()
    assert _uid(server.proc.pid) == 0  # the monitor keeps root: it binds, signals, writes the pid file
    for process in status["processes"]:
        assert _uid(process["pid"]) == user.pw_uid, process
        with open(f"/proc/{process['pid']}/status") as f:
            gid = int(next(line for line in f if line.startswith("Gid:")).split()[1])
        assert gid == group.gr_gid
    assert server.get("/")[0] == 200
    assert oct(sock.stat().st_mode & 0o777) == oct(0o770)  # --umask 007 (gunicorn: the socket's mode)
    assert (tmp_path / "error.log").stat().st_uid == user.pw_uid  # workers can reopen it on USR1


def test_the_privileges_config_file_drops_to_nobody(start_server, tmp_path):
    _others_can_read_the_checkout()
    env = {"LOG_DIR": str(tmp_path)}
    server = start_server("-c", str(TESTS / "gunicorn_configs" / "privileges.py"), workers=1, env=env)
    nobody = pwd.getpwnam("nobody").pw_uid
    assert all(_uid(p["pid"]) == nobody for p in server.status()["processes"])
    assert server.get("/")[0] == 200
    assert (tmp_path / "app.pid").read_text().strip() == str(server.proc.pid)


# ---------------------------------------------------------------------------------------------
# Logging


def test_syslog_gets_the_error_log_over_udp(start_server, tmp_path):
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(20)
    port = listener.getsockname()[1]
    try:
        start_server(
            "--log-syslog", "--log-syslog-to", f"udp://127.0.0.1:{port}", "--log-syslog-prefix", "shop",
            "--log-syslog-facility", "local0", workers=1,
        )  # fmt: skip
        seen = []
        while not any(b"is the current mold" in d for d in seen):
            seen.append(listener.recv(4096))
    finally:
        listener.close()
    line = next(d for d in seen if b"is the current mold" in d).decode()
    assert line.startswith("<134>refork.shop: [")  # local0.info, gunicorn's program name form


def test_logconfig_dict_formats_the_error_log(start_server, tmp_path):
    out = tmp_path / "json.log"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(
        "logconfig_dict = {\n"
        "    'version': 1,\n"
        "    'formatters': {\n"
        "        'json': {'format': '{\"level\": \"%(levelname)s\", \"msg\": \"%(message)s\"}'},\n"
        "    },\n"
        f"    'handlers': {{'file': {{'class': 'logging.FileHandler', 'filename': {str(out)!r}, "
        "'formatter': 'json'}},\n"
        "    'loggers': {'gunicorn.error': {'level': 'INFO', 'handlers': ['file']}},\n"
        "}\n"
    )
    server = start_server("-c", str(conf), workers=1)
    assert server.get("/")[0] == 200
    lines = _wait(lambda: [line for line in out.read_text().splitlines() if "ready" in line], "JSON lines")
    assert lines[0].startswith('{"level": "INFO", "msg": ')


def test_log_config_file_routes_the_error_log(start_server, tmp_path):
    out = tmp_path / "ini.log"
    ini = tmp_path / "logging.ini"
    ini.write_text(
        "[loggers]\nkeys=root,error\n[handlers]\nkeys=file\n[formatters]\nkeys=plain\n"
        "[logger_root]\nlevel=WARNING\nhandlers=\n"
        "[logger_error]\nlevel=INFO\nhandlers=file\nqualname=gunicorn.error\n"
        f"[handler_file]\nclass=FileHandler\nformatter=plain\nargs=({str(out)!r},)\n"
        "[formatter_plain]\nformat=INI %(levelname)s %(message)s\n"
    )
    start_server("--log-config", str(ini), workers=1)
    _wait(lambda: out.exists() and "INI INFO" in out.read_text(), "the ini logger's lines")


def test_capture_output_sends_prints_to_the_error_log(start_server, tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text("def post_fork(server, worker):\n    print('printed by', worker.pid, flush=True)\n")
    error_log = tmp_path / "error.log"
    server = start_server("-c", str(conf), "--capture-output", "--error-logfile", str(error_log), workers=1)
    pid = server.workers()[0]["pid"]
    _wait(lambda: f"printed by {pid}" in error_log.read_text(), "the print in the error log")


@pytest.mark.parametrize("flag", ["--error-logfile", "--access-logfile"])
def test_a_log_file_in_a_missing_directory_is_one_line(flag, tmp_path):
    result = _run(flag, "./log/app.log", "-b", f"127.0.0.1:{free_port()}", "--chdir", str(TESTS),
                  "apps.procs:app", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"refork: error: {flag} ./log/app.log: No such file or directory; create the directory"
    ]


# ---------------------------------------------------------------------------------------------
# The first ten minutes


def test_uvicorn_worker_class_then_app_serves_asgi(start_server):
    server = start_server("-k", "uvicorn.workers.UvicornWorker", app="apps.asgi_apps:app", workers=1)
    status, body = server.get("/scope")
    assert status == 200 and json.loads(body)["path"] == "/scope"  # an ASGI scope: served as ASGI


def test_preload_says_refork_always_preloads(start_server):
    server = start_server("--preload", workers=1)
    assert "--preload: refork always preloads" in server.log()


def test_help_shows_defaults():
    text = _run("--help").stdout
    assert "(default: 30)" in text  # --timeout
    assert "(default: 127.0.0.1:8000)" in text  # --bind
    assert "-k" in text and "--worker-class CLASS" in text  # (3.14's argparse: "-k, --worker-class CLASS")


def test_a_missing_app_module_is_one_line_before_anything_is_bound():
    port = free_port()
    result = _run("-b", f"127.0.0.1:{port}", "myproject.wsgi:application")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"refork: error: cannot import 'myproject.wsgi': no module named 'myproject' (check APP and "
        f"--chdir/--pythonpath; cwd is {ROOT})"
    ]
    assert result.stdout == ""


def test_an_app_import_error_shows_the_apps_frames_first(start_server):
    server = start_server(app="apps.broken_on_import:app", workers=1, wait=False)
    text = _wait(lambda: "the app failed to load" in server.log() and server.log(), "the load error")
    after = text.split("Traceback (most recent call last):", 1)[1].splitlines()
    assert "broken_on_import.py" in after[1], text  # no refork or importlib frame before it
    assert str(Path(refork.__file__).parent) not in "\n".join(after[:4])  # (its checkout may be named refork)


def test_check_config_import_error_shows_the_apps_frames_first():
    result = _run("--check-config", "--chdir", str(TESTS), "apps.broken_on_import:app")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "broken_on_import.py" in lines[1]
    error = "refork: error: the app failed to load: RuntimeError: this app is broken at import time"
    assert lines[-1] == error


def test_run_example_keeps_the_app_when_given_options():
    """scripts/run-example passes its arguments to refork and names the example app in REFORK_APP,
    which an APP argument overrides."""
    script = (ROOT / "scripts" / "run-example").read_text()
    assert 'REFORK_APP="${REFORK_APP:-hello:app}" exec .venv/bin/refork' in script and '"$@"' in script
    printed = _run("--print-config", "--workers", "4", "--chdir", "examples", env={"REFORK_APP": "hello:app"})
    lines = printed.stdout.splitlines()
    assert any(line.startswith("app = 'hello:app'") for line in lines)
    assert any(line.startswith("workers = 4 ") for line in lines)


# ---------------------------------------------------------------------------------------------
# Binds, as gunicorn reads them


def _get_unix(path: Path) -> int:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return int(sock.recv(64).split()[1])


def test_a_unix_double_slash_bind_is_relative_to_chdir(start_server, tmp_path):
    """PostHog's `bind = 'unix://tmp/nginx.socket'`: gunicorn binds ./tmp/nginx.socket (under
    --chdir), where nginx was pointed, not /tmp/nginx.socket."""
    (tmp_path / "tmp").mkdir()
    start_server("-b", "unix://tmp/nginx.socket", "--chdir", str(tmp_path), "--pythonpath", str(TESTS),
                 workers=1)  # fmt: skip
    assert _get_unix(tmp_path / "tmp" / "nginx.socket") == 200


def test_server_address_in_a_hook_is_gunicorns(start_server, tmp_path):
    """PostHog's banner formats `http://{host}:{port}` from server.address: (host, port) tuples and
    unix paths, as gunicorn's util.parse_address makes them."""
    from gunicorn.util import parse_address

    seen = tmp_path / "address"
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(f"def when_ready(server):\n    open({str(seen)!r}, 'w').write(repr(server.address))\n")
    binds = [f":{free_port()}", "LOCALHOST:" + str(free_port()), f"unix:{tmp_path / 'app.sock'}"]
    server = start_server("-c", str(conf), *(arg for bind in binds for arg in ("-b", bind)), workers=1)
    address = ast.literal_eval(server.wait_for(seen.read_text, what="when_ready"))
    assert address == [parse_address(bind) for bind in [f"127.0.0.1:{server.port}", *binds]]
    assert address[1][0] == "" and isinstance(address[3], str)


def test_what_a_config_file_and_a_hook_print_is_written_once(start_server, tmp_path):
    """stdout to a file is block-buffered: a print left in the buffer at a fork would be written
    again by every process that inherited it (each worker, each mold of a refork)."""
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(
        "import os\n"
        "print('config file read')\n"
        "def post_worker_init(worker):\n"
        "    print('worker', os.getpid(), 'ready')\n"
    )
    server = start_server("-c", str(conf), env={"PYTHONUNBUFFERED": ""}, workers=4)
    server.signal(signal.SIGUSR2)  # a refork: a worker forks the next mold
    server.wait_for(lambda: "promoted to mold" in server.log(), what="the refork")
    server.wait_ready(4)
    server.stop()
    lines = server.log_path.read_text().splitlines()
    printed = [line for line in lines if line == "config file read" or line.startswith("worker ")]
    assert printed.count("config file read") == 1, printed
    assert len(printed) == len(set(printed)) >= 5, printed


# ---------------------------------------------------------------------------------------------
# Process settings that change what is served


def test_reuse_port_lets_another_socket_bind_the_port(start_server):
    server = start_server("--reuse-port", workers=1)
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", server.port))  # EADDRINUSE without --reuse-port on refork's side
    finally:
        other.close()


def test_limit_request_line_zero_is_gunicorns_no_limit(start_server):
    server = start_server("--limit-request-line", "0", workers=1)
    assert server.get("/" + "x" * 20000)[0] == 200
    strict = start_server(workers=1)
    assert strict.get("/" + "x" * 20000)[0] == 414


def test_reload_extra_file_reloads_on_a_template_change(start_server, tmp_path):
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "page.html").write_text("one")
    server = start_server("--reload", "--reload-dir", str(tmp_path), "--reload-extra-file",
                          str(templates / "*.html"), workers=1)  # fmt: skip
    later = templates / "new.html"  # created after the start: the pattern finds it
    later.write_text("two")
    server.wait_for(lambda: "new.html changed" in server.log(), what="the reload")
    server.wait_for(lambda: "reload: starting a new mold" in server.log(), what="the new mold")


def test_raw_env_is_set_before_the_app_is_imported(start_server, tmp_path):
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(
        "raw_env = ['GREETING=from raw_env']\n"
        "def post_fork(server, worker):\n"
        "    import os\n"
        f"    open({str(tmp_path / 'seen')!r}, 'w').write(os.environ['GREETING'])\n"
    )
    start_server("-c", str(conf), workers=1)
    assert (tmp_path / "seen").read_text() == "from raw_env"
    start_server("-c", str(conf), "-e", "GREETING=from -e", workers=1)  # the command line's list wins
    assert (tmp_path / "seen").read_text() == "from -e"


def test_ssl_context_hook_makes_the_tls_context(start_server, tmp_path):
    """gunicorn's ssl_context(config, default_ssl_context_factory): here TLS 1.3 only."""
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    conf = tmp_path / "gunicorn.conf.py"
    conf.write_text(
        "def ssl_context(conf, default_ssl_context_factory):\n"
        "    import ssl\n"
        "    context = default_ssl_context_factory()\n"
        "    context.minimum_version = ssl.TLSVersion.TLSv1_3\n"
        "    return context\n"
    )
    server = start_server("-c", str(conf), "--certfile", str(tmp_path / "cert.pem"),
                          "--keyfile", str(tmp_path / "key.pem"), workers=1)  # fmt: skip

    def handshake(most: ssl.TLSVersion) -> str:
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        context.maximum_version = most
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        with raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return str(tls.version())

    assert handshake(ssl.TLSVersion.TLSv1_3) == "TLSv1.3"
    with pytest.raises(ssl.SSLError):
        handshake(ssl.TLSVersion.TLSv1_2)
