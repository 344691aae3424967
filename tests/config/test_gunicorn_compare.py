"""The gunicorn-behaviour suite, over the collection: each config file of tests/gunicorn_configs and
a few real command lines, started as `gunicorn ARGS` and as `refork ARGS` (real processes, one at a
time), the same requests sent, and what a user sees compared: the binds that answer (IPv4, IPv6,
unix), the worker count, the access line, the environ keys, the hooks called and what they got, HUP
and TERM. What differs on purpose is in docs/from-gunicorn.md and encoded here by name."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme
from conftest import ROOT, TESTS, LoggedProcess, free_port
from support.waits import wait_until

CONFIGS = TESTS / "gunicorn_configs"
WSGI, ASGI = "apps.compare_apps:wsgi", "apps.compare_apps:asgi"
HOOKS = {"on_starting": "server", "on_reload": "server", "when_ready": "server",
         "pre_fork": "server, worker", "post_fork": "server, worker", "post_worker_init": "worker",
         "pre_request": "worker, req", "post_request": "worker, req, environ, resp",
         "child_exit": "server, worker", "worker_exit": "server, worker",
         "nworkers_changed": "server, new_value, old_value", "on_exit": "server"}  # fmt: skip
# What a hook reads of its arguments (gunicorn's documented attributes, as the config files use them).
ATTRIBUTES = {"server": ("log", "cfg", "pid", "address", "num_workers", "proc_name", "timeout"),
              "worker": ("pid", "ppid", "age", "alive", "log", "cfg", "timeout", "max_requests"),
              "req": ("method", "path", "query", "uri", "version", "headers"),
              "resp": ("status", "status_code", "headers", "sent", "response_length")}  # fmt: skip

RECORDER = """
import os as _os
_RECORD = _os.environ["HOOK_RECORD"]
_CONFIG = {config!r}
if _CONFIG:
    exec(compile(open(_CONFIG).read(), _CONFIG, "exec"))


def _seen(name, inner, **args):
    kinds = []
    for arg, value in args.items():
        if arg in {attributes!r}:
            kinds.append(arg + "(" + ",".join(a for a in {attributes!r}[arg] if hasattr(value, a)) + ")")
        else:
            kinds.append(arg + ":" + type(value).__name__)
    with open(_RECORD, "a") as f:
        f.write(name + " " + " ".join(kinds) + "\\n")
    if inner is not None:
        inner(**args)
"""


def recorder(config: Path | None) -> str:
    """A config file that reads `config` and wraps each of its hooks (or adds one) to write one
    line per call: the hook's name and, per argument, the attributes it has or its type."""
    text = RECORDER.format(config=str(config) if config else None, attributes=ATTRIBUTES)
    for hook, args in HOOKS.items():
        keywords = ", ".join(f"{a}={a}" for a in args.split(", "))
        text += (f"\n_{hook} = globals().get({hook!r})\n\n\ndef {hook}({args}):\n"
                 f"    _seen({hook!r}, _{hook}, {keywords})\n")  # fmt: skip
    return text


@dataclass
class Case:
    """A config file (or none) and a command line, with what to send them."""

    config: str | None
    args: list[str]
    app: str = WSGI
    env: dict[str, str] = field(default_factory=dict)
    workers: int = 1
    probes: tuple[str, ...] = ("127.0.0.1",)  # where a client connects: an address family each
    files: dict[str, str] = field(default_factory=dict)  # written in the server's directory first
    tls: bool = False  # the client speaks HTTPS (to CERT_DIR's certificate, made first)
    adapted: str = ""  # settings added after the config file's


class Running(LoggedProcess):
    """`python -m gunicorn|refork ARGS` in its own directory, output to a log file."""

    def __init__(self, program: str, case: Case, tmp: Path) -> None:
        self.program, self.tmp, self.case = program, tmp, case
        self.port, self.sock = free_port(), tmp / "app.sock"
        self.record, self.access = tmp / "hooks", tmp / "access.log"
        conf = tmp / "gunicorn.conf.py"
        conf.write_text(recorder(CONFIGS / f"{case.config}.py" if case.config else None) + case.adapted)
        args = [a.format(port=self.port, sock=self.sock, tmp=tmp) for a in case.args]
        own = ["--control-socket", str(tmp / "ctl"), "--refork-after", "off", "--mold-idle-exit", "off"]
        self.log_path = tmp / "output.log"
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),  # this checkout's refork
               "HOOK_RECORD": str(self.record), "LOG_DIR": str(tmp),
               **{k: v.format(port=self.port, tmp=tmp) for k, v in case.env.items()}}  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", program, *(own if program == "refork" else []), "-c", str(conf),
             "--access-logfile", str(self.access), "--chdir", str(TESTS), *args, case.app],
            cwd=tmp, stdout=self.log_file, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        wait_until(lambda: self._serving(), what=f"{program} serving")

    def _serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.program} exited ({self.proc.returncode}):\n{self.log()}")
        return len(self.workers()) >= self.case.workers and self.get(self.case.probes[0])[0] == 200

    def workers(self) -> list[int]:
        """The pids of the worker processes (a refork mold is not one)."""
        if self.program == "refork":
            from refork.process.control import request

            try:
                status = request(str(self.tmp / "ctl"), "status")
            except OSError:
                return []
            return [p["pid"] for p in status["processes"] if p["role"] == "worker" and p["state"] == "ready"]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return [int(pid) for pid in children]

    def get(self, where: str, target: str = "/environ?x=1") -> tuple[int, str]:
        """(status, body) of one GET from `where`: an address or `unix`; (0, error) if unreachable."""
        try:
            if where == "unix":
                conn: http.client.HTTPConnection = _UnixConnection(str(self.sock))
            elif self.case.tls:
                context = ssl.create_default_context(cafile=str(self.tmp / "ca.pem"))
                conn = http.client.HTTPSConnection(where, self.port, timeout=10, context=context)
            else:
                conn = http.client.HTTPConnection(where, self.port, timeout=10)
            conn.request("GET", target, headers={"Referer": "http://example.com/", "User-Agent": "compare/1"})
            response = conn.getresponse()
            return response.status, response.read().decode()
        except OSError as error:
            return 0, type(error).__name__
        finally:
            conn.close()

    def access_line(self) -> str | None:
        """The access line of `GET /fixed`, from the access log file or stdout (`--access-logfile -`)."""
        text = (self.access.read_text() if self.access.exists() else "") + self.log()
        return next((line for line in text.splitlines() if "GET /fixed" in line), None)

    def called(self, hook: str) -> bool:
        return any(line.startswith(hook + " ") for line in self.hooks())

    def hooks(self) -> list[str]:
        return self.record.read_text().splitlines() if self.record.exists() else []


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


ACCESS_FIELDS = re.compile(r'"[^"]*"|\[[^\]]*\]|\S+')


def _access_fields(line: str) -> list[str]:
    """An access line's fields, the time masked (it differs): gunicorn's default format,
    `%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"`."""
    return ["[time]" if part.startswith("[") else part for part in ACCESS_FIELDS.findall(line)]


def observe(program: str, case: Case, tmp: Path) -> dict:
    """What a user sees of one server: reached binds, workers, the environ, the access line, the
    hooks (each once, by name and arguments), HUP's effect, TERM's exit code."""
    tmp.mkdir(mode=0o777)
    tmp.chmod(0o1777)  # a config that drops privileges writes here too
    for name, text in case.files.items():
        (tmp / name).parent.mkdir(exist_ok=True)
        (tmp / name).write_text(text.format(tmp=tmp))
    if case.tls:
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
        issued = ca.issue_cert("127.0.0.1")
        issued.cert_chain_pems[0].write_to_path(str(tmp / "server.pem"))
        issued.private_key_pem.write_to_path(str(tmp / "server.key"))
    server = Running(program, case, tmp)
    try:
        seen: dict = {"workers": len(server.workers())}
        seen["reached"] = {where: server.get(where)[0] for where in case.probes}
        seen["environ"] = json.loads(server.get(case.probes[0])[1].replace(str(server.port), "PORT"))
        server.get(case.probes[0], "/fixed?x=1")
        seen["access"] = _access_fields(wait_until(server.access_line, what="the access line"))
        before = set(server.workers())
        server.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: set(server.workers()) - before and server.called("on_reload"), what="HUP's workers"
        )
        served = lambda: server.get(case.probes[0])[0] == 200 and 200  # noqa: E731
        seen["after HUP"] = wait_until(served, what="served after HUP")
        server.proc.send_signal(signal.SIGTERM)
        seen["TERM exit code"] = server.proc.wait(30)
        error_log = tmp / "error.log"  # django_vm.py's errorlog
        seen["error log"] = server.log() + (error_log.read_text() if error_log.exists() else "")
        seen["hooks"] = sorted(set(server.hooks()))
        return seen
    finally:
        server.stop()


BIND = ["-b", "127.0.0.1:{port}"]
SINKS = {"SYSLOG_ADDR": "udp://127.0.0.1:9", "STATSD_HOST": "127.0.0.1:9"}  # the discard port
INI = (
    "[loggers]\nkeys=root,error\n[handlers]\nkeys=file\n[formatters]\nkeys=plain\n"
    "[logger_root]\nlevel=WARNING\nhandlers=\n[logger_error]\nlevel=INFO\nhandlers=file\nqualname=gunicorn.error\n"
    "[handler_file]\nclass=FileHandler\nformatter=plain\nargs=('{tmp}/error.log',)\n"
    "[formatter_plain]\nformat=INI %(levelname)s %(message)s\n"
)
JSON = '{{"version": 1, "disable_existing_loggers": false}}'
NOT_NONE = "gunicorn.ctl"  # gunicorn 27's master stops on `control_socket = None` (see the last test)
UVICORN = ["-k", "uvicorn.workers.UvicornWorker"]
CASES = {
    "-w 2 -b 0.0.0.0:PORT": Case(None, ["-w", "2", "-b", "0.0.0.0:{port}"], workers=2),
    "--preload --max-requests 100 -k gthread --threads 4": Case(
        None, [*BIND, "--preload", "--max-requests", "100", "-k", "gthread", "--threads", "4"]),
    "-b [::]:PORT": Case(None, ["-b", "[::]:{port}"], probes=("::1", "127.0.0.1")),
    "-b unix:PATH --access-logfile -": Case(
        None, ["-b", "unix:{sock}", "--access-logfile", "-"], probes=("unix",)),
    "django_vm.py": Case("django_vm", BIND, workers=2),
    "behind_proxy.py": Case("behind_proxy", BIND, workers=2),
    "fastapi_docker.py": Case("fastapi_docker", [*UVICORN, *BIND], ASGI, {"WEB_CONCURRENCY": "2"}, workers=2),
    "logging_syslog.py": Case("logging_syslog", BIND, env=SINKS, workers=2),
    "asgi_worker.py": Case("asgi_worker", BIND, ASGI, workers=2, adapted=f"control_socket = {NOT_NONE!r}\n"),
    "dev_reload.py": Case("dev_reload", BIND, files={"templates/page.html": "page"}),
    "logging_files.py": Case("logging_files", BIND, files={"logging.ini": INI, "logging.json": JSON}),
    "tls_h2.py": Case("tls_h2", BIND, env={"CERT_DIR": "{tmp}"}, tls=True),
}  # fmt: skip


def _hooks(lines: list[str]) -> dict[str, list[dict[str, str]]]:
    """Each hook's calls, as {argument: what it had}."""
    calls: dict[str, list[dict[str, str]]] = {}
    for line in lines:
        name, *args = line.split(" ")
        calls.setdefault(name, []).append(dict(re.match(r"(\w+)[:(](.*)", a).groups() for a in args))  # type: ignore[union-attr]
    return calls


def _covers(theirs: dict[str, str], ours: dict[str, str]) -> bool:
    """refork's call has what gunicorn's had: the same types, at least the same attributes."""
    return theirs.keys() == ours.keys() and all(
        set(theirs[a].rstrip(")").split(",")) <= set(ours[a].rstrip(")").split(",")) for a in theirs
    )


def documented(case: Case, gunicorn: dict) -> dict:
    """What refork shows where gunicorn shows `gunicorn`: gunicorn's observations with the
    differences docs/from-gunicorn.md lists ("Seen side by side") applied."""
    expected = json.loads(json.dumps(gunicorn))
    environ, uvicorn = expected["environ"], case.args[:2] == UVICORN
    keys = set(environ["keys"])
    if (
        case.app == WSGI
    ):  # refork's own request object for gunicorn's socket; the raw target as Apache names it
        keys = keys - {"gunicorn.socket"} | {"REQUEST_URI", "refork.request"}
        environ["values"]["wsgi.multiprocess"] = True  # a replacement worker may serve beside any worker
        environ["values"]["SERVER_NAME"] = environ["values"]["HTTP_HOST"].rsplit(":", 1)[0].strip("[]")
    else:  # the scope's extensions (http.response.early_hint...)
        keys |= {"extensions"}
    environ["keys"] = sorted(keys)
    access = expected["access"]
    if uvicorn:
        access[0] = access[0].rsplit(":", 1)[0]  # uvicorn's line without the client's port
    elif case.config in ("logging_syslog", "logging_files"):  # a dictConfig's gunicorn.access is not refork's
        access[:] = ["127.0.0.1", "-", "-", "[time]", '"GET /fixed?x=1 HTTP/1.1"', "200", "6",
                     '"http://example.com/"', '"compare/1"']  # fmt: skip
    if case.config == "django_vm":
        access[-1] = "D"  # %(D)s, the duration
    calls = _hooks(expected["hooks"])
    if uvicorn:  # refork's request hooks run under any worker class
        calls.update({h: [] for h in ("pre_request", "post_request", "worker_exit")})
    expected["hooks"] = calls
    return expected


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_gunicorn_config_behaves_under_refork_as_under_gunicorn(tmp_path, case):
    gunicorn = observe("gunicorn", case, tmp_path / "gunicorn")
    refork = observe("refork", case, tmp_path / "refork")
    expected = documented(case, gunicorn)
    assert refork["workers"] == expected["workers"] == case.workers
    assert refork["reached"] == expected["reached"] == dict.fromkeys(case.probes, 200)
    assert refork["environ"] == expected["environ"]
    if case.config == "django_vm":
        refork["access"][-1] = "D"
    assert refork["access"] == expected["access"]
    assert refork["after HUP"] == expected["after HUP"] == 200
    assert refork["TERM exit code"] == expected["TERM exit code"] == 0
    said = gunicorn["error log"]  # TERM's lines; refork's own words (docs/from-gunicorn.md):
    assert "Handling signal: term" in said and "Shutting down: Master" in said, said
    said = refork["error log"]
    assert "graceful stop:" in said and re.search(r"monitor \d+: stopped", said), said
    calls = _hooks(refork["hooks"])
    for hook, theirs in expected["hooks"].items():
        for call in theirs:
            assert any(_covers(call, ours) for ours in calls.get(hook, [])), (hook, call, calls.get(hook))
    assert calls.keys() >= expected["hooks"].keys()
    assert {h: calls[h] for h in calls.keys() - expected["hooks"].keys()} == {}


@pytest.mark.parametrize(
    ("config", "app", "gunicorn_says", "refork_says"),
    [
        ("gevent_chat", WSGI, "gevent worker requires gevent", "refork does not monkey-patch"),
        ("asgi_worker", ASGI, "TypeError: expected str, bytes or os.PathLike object, not NoneType", None),
    ],
)  # fmt: skip
def test_a_config_gunicorn_27_cannot_run_is_served(tmp_path, config, app, gunicorn_says, refork_says):
    """gevent_chat.py without gevent installed (gunicorn's worker needs it; refork's runs the app on
    threads, with one WARNING), asgi_worker.py's `control_socket = None` (gunicorn 27's master stops)."""
    gunicorn = subprocess.run(
        [sys.executable, "-m", "gunicorn", "-c", str(CONFIGS / f"{config}.py"),
         "-b", f"127.0.0.1:{free_port()}", "--chdir", str(TESTS), app],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert gunicorn.returncode != 0 and gunicorn_says in gunicorn.stderr, gunicorn.stderr
    tmp_path.joinpath("refork").mkdir()
    refork = Running("refork", Case(config, BIND, app, workers=1), tmp_path / "refork")
    try:
        assert refork.get("127.0.0.1")[0] == 200
        assert refork_says is None or any(
            "WARNING" in line and refork_says in line for line in refork.log().splitlines()
        ), refork.log()
    finally:
        refork.stop()
