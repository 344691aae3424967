"""Real WebSocket clients against real frameworks, served by refork and by uvicorn (issue 11,
"Conformance and real clients"; docs/websocket-clients.md).

Apps: tests/apps/ws_fastapi.py (FastAPI) and tests/apps/ws_channels.py (Django Channels), the same
endpoints (tests/apps/ws_shared.py). Clients:
- tests/clients/ws_client.py (the `websockets` client): its JSON summary must be the expected one,
  and the same under refork as under uvicorn serving the same app;
- tests/clients/ws_node.js (Node's `ws`, installed from npm by the `node_ws` fixture: no network for
  npm is a failure, not a skip);
- headless Chromium (Debian's `chromium`) loading the app's page, which echoes 1,000 messages over a
  WebSocket and reports the result in a new request (/report) that the test waits for.

One server per (server, app) pair, module-scoped, one worker: the broadcast room of the apps is per
worker process (the in-memory room and channel layer). Last, refork alone: a reload (1012) and a
stop (1001) with WebSockets open on both frameworks.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, LoggedProcess, Server, free_port
from support.chromium import run_page

CLIENTS = TESTS / "clients"
APPS = {"fastapi": "apps.ws_fastapi:app", "channels": "apps.ws_channels:application"}
SERVERS = ("refork", "uvicorn")
PAIRS = [(server, app) for app in APPS for server in SERVERS]
PAIR_IDS = [f"{server}-{app}" for server, app in PAIRS]
N_PYTHON = 500  # text and binary echoes each, plus 1 MB ones (ws_client.py)
N_BROWSER = 1000  # the 1,000 messages (Chromium, Node)
# both servers: 2 MB messages at most (ws_client.py's too_big step sends 3 MB, its echoes 1 MB), and
# keep-alive pings every half second (Node's ws counts the pings it answers)
MAX_SIZE = 2 << 20
PING_INTERVAL = 0.5
WS_NODE_VERSION = json.loads((CLIENTS / "package.json").read_text())["dependencies"]["ws"]

pytestmark = pytest.mark.timeout(120)


def _wait_http(port: int, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited ({proc.returncode}):\n{log.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/closes?tag=probe", timeout=2):
                return
        except urllib.error.HTTPError as e:
            if e.code == 404:  # the app answers: up
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"server not answering after {timeout}s:\n{log.read_text(errors='replace')}")


class Uvicorn(LoggedProcess):
    """`python -m uvicorn` serving one of the test apps (websockets implementation, its defaults)."""

    def __init__(self, tmp: Path, app: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log_path = tmp / f"uvicorn-{self.port}.log"
        self.log_file = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(TESTS), "--host", "127.0.0.1"]
            + ["--port", str(self.port), "--log-level", "warning"]
            + ["--ws-max-size", str(MAX_SIZE), "--ws-ping-interval", str(PING_INTERVAL), app],
            cwd=ROOT,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        )
        _wait_http(self.port, self.proc, self.log_path)


class Served:
    def __init__(self, kind: str, app: str, backend: Server | Uvicorn, state: Path) -> None:
        self.kind, self.app, self.backend, self.state = kind, app, backend, state
        self.url = f"http://127.0.0.1:{backend.port}"

    def log(self) -> str:
        return self.backend.log()


@contextlib.contextmanager
def _serve(kind: str, app: str, tmp: Path) -> Iterator[Served]:
    state = tmp / "state"
    state.mkdir(parents=True)
    env = {"WS_STATE_DIR": str(state)}
    backend: Server | Uvicorn
    if kind == "refork":
        args = ["-w", "1", "--ws-max-size", str(MAX_SIZE), "--ws-ping-interval", str(PING_INTERVAL)]
        backend = Server(tmp, args, APPS[app], env)
        try:
            backend.wait_ready(1)
            _wait_http(backend.port, backend.proc, backend.log_path)
        except BaseException:
            backend.stop()
            raise
    else:
        backend = Uvicorn(tmp, APPS[app], env)
    try:
        yield Served(kind, app, backend, state)
    finally:
        backend.stop()


@pytest.fixture(scope="module", params=PAIRS, ids=PAIR_IDS)
def served(request, tmp_path_factory):
    kind, app = request.param
    with _serve(kind, app, tmp_path_factory.mktemp(f"{kind}-{app}")) as s:
        yield s


@pytest.fixture(scope="session")
def node_ws() -> Path:
    """Node's `ws` at the version pinned in tests/clients/package.json, from npm (once: a cache)."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    assert node and npm, "node and npm are needed (Debian's nodejs and npm: ./scripts/test installs them)"
    installed = CLIENTS / "node_modules" / "ws" / "package.json"
    if not installed.exists() or json.loads(installed.read_text())["version"] != WS_NODE_VERSION:
        result = subprocess.run(
            [npm, "install", "--no-package-lock", "--no-audit", "--no-fund", "--prefix", str(CLIENTS)],
            cwd=CLIENTS,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if result.returncode != 0 or not installed.exists():
            pytest.fail(
                f"npm could not install ws@{WS_NODE_VERSION} into {CLIENTS / 'node_modules'} "
                f"(network?):\n{result.stdout}\n{result.stderr}"
            )
    return Path(node)


def _run_client(cmd: list[str], served: Served, timeout: float = 90) -> dict:
    """Run a client script, return its JSON summary (the last line it printed)."""
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    lines = result.stdout.strip().splitlines()
    assert lines, f"{cmd[1]} printed nothing (rc {result.returncode}):\n{result.stderr}\n{served.log()}"
    summary = json.loads(lines[-1])
    summary.setdefault("errors", [])
    if result.returncode != 0 and not summary["errors"]:
        summary["errors"].append(f"exit status {result.returncode}: {result.stderr[-2000:]}")
    return summary


def _check(summary: dict, served: Served) -> dict:
    assert not summary["errors"], (
        f"{served.kind} serving {served.app}: {summary['errors']}\nserver log:\n{served.log()[-5000:]}"
    )
    _log_is_clean(served)
    return summary


def _log_is_clean(served: Served) -> None:
    """Everything a client did here is ordinary: refork logs no error and no traceback for it."""
    if served.kind == "refork":
        bad = [line for line in served.log().splitlines() if "[ERROR]" in line or "Traceback" in line]
        assert not bad, f"refork logged errors:\n{served.log()[-5000:]}"


# --- the `websockets` client: the expected summary, and the same under refork as under uvicorn ---

EXPECTED_PYTHON = {
    "n": N_PYTHON,
    "echo": {
        "extensions": ["permessage-deflate"],
        "subprotocol": None,
        "accept_header": "echo",
        "text_ok": N_PYTHON,
        "binary_ok": N_PYTHON,
        "unicode_ok": 7,
        "big_text_ok": 1,
        "big_binary_ok": 1,
        "empty_ok": 2,
        "fragmented_text": "fragmented ☃",
        "fragmented_binary": [0, 1, 255],
        "pong": True,
    },
    "scope": {
        "type": "websocket",
        "asgi_version": "3.0",
        "scheme": "ws",
        "http_version": "1.1",
        "path": "/ws/echo",
        "raw_path": "/ws/echo",
        "query_string": "x=1&y=%C3%A9",
        "root_path": "",
        "subprotocols": ["chat.v1", "other"],
        "header_names": [
            "connection",
            "host",
            "sec-websocket-extensions",
            "sec-websocket-key",
            "sec-websocket-protocol",
            "sec-websocket-version",
            "upgrade",
            "user-agent",
        ],
        "client_is_address": True,
        "server_is_address": True,
        "extensions": ["websocket.http.response"],
    },
    "subprotocols": {
        "chat.v1": "chat.v1",
        "chat.v2,chat.v1": "chat.v2",
        "chat.v1,chat.v2": "chat.v1",
        "unknown": None,
    },
    "broadcast": [[f"from client {k} ☃" for k in range(3)]] * 3,
    "server_close": {"code": 4000, "reason": "server bye"},
    "client_close": {"code": 4001, "reason": "client bye"},
    "deny": {
        "/ws/deny": {"status": 403},
        "/ws/deny-body": {"status": 401, "body": "custom denial"},
    },
    "too_big": {"code": 1009},
    "errors": [],
}


def _as_refork_closes(summary: dict, kind: str) -> dict:
    """uvicorn closes the TCP connection right after its 1009 while the client is still sending the
    message that was too big: the unread bytes make its kernel send a reset, which can reach the
    client before the close frame does (1006, more often on a loaded machine). refork lingers until
    the client's bytes stop, so its 1009 always arrives. The comparison is of the apps' behaviour."""
    if kind == "uvicorn" and summary.get("too_big") == {"code": 1006}:
        summary["too_big"] = {"code": 1009}
    return summary


def _spec_version(summary: dict) -> tuple[int, ...]:
    """The scope's asgi spec_version, taken out of the summary: refork may advertise a newer one
    than uvicorn (the issue: "the version uvicorn advertises or newer")."""
    version = (summary.get("scope") or {}).pop("spec_version", None) or "0"
    return tuple(int(part) for part in version.split("."))


_python_summaries: dict[tuple[str, str], dict] = {}


def _python_summary(served: Served) -> dict:
    cmd = [sys.executable, str(CLIENTS / "ws_client.py"), served.url, "--n", str(N_PYTHON)]
    summary = _python_summaries[served.kind, served.app] = _run_client(cmd, served)
    return summary


def test_python_client(served):
    summary = _as_refork_closes(copy.deepcopy(_check(_python_summary(served), served)), served.kind)
    assert _spec_version(summary) >= (2, 3), "websocket reason fields need ASGI spec 2.3"
    assert summary == EXPECTED_PYTHON


@pytest.mark.parametrize("app", list(APPS))
def test_python_client_same_as_uvicorn(app, tmp_path):
    """The issue's 'the same client script against uvicorn gives the same results' (the summaries
    of test_python_client, or new runs when that test was not run)."""
    runs = {}
    for kind in SERVERS:
        runs[kind] = _python_summaries.get((kind, app))
        if runs[kind] is None:
            with _serve(kind, app, tmp_path / kind) as served:
                runs[kind] = _python_summary(served)
    refork = copy.deepcopy(runs["refork"])
    uvicorn = _as_refork_closes(copy.deepcopy(runs["uvicorn"]), "uvicorn")
    assert _spec_version(refork) >= _spec_version(uvicorn)
    assert refork == uvicorn


# --- Node's ws ---


def test_node_ws(served, node_ws):
    cmd = [str(node_ws), str(CLIENTS / "ws_node.js"), served.url, str(N_BROWSER)]
    summary = _check(_run_client(cmd, served), served)
    echo = summary["echo"]
    assert summary["ws_version"] == WS_NODE_VERSION
    assert echo["text_ok"] == N_BROWSER
    assert echo["binary_ok"] == echo["binary_sent"] == N_BROWSER // 10 + 1
    assert echo["negotiated"] == "permessage-deflate"
    assert echo["extensions_header"].split(";")[0].strip() == "permessage-deflate"
    assert echo["server_close"] == {"code": 4000, "reason": "node bye"}
    assert summary["client_close"] == {"code": 4002, "reason": "node client bye"}
    assert summary["deny"] == {"status": 403}
    assert summary["pings"] >= 1, "no keep-alive ping reached ws in 10 s"


# --- headless Chromium ---


def test_chromium(served):
    token = f"t{os.getpid()}{time.monotonic_ns()}"
    report = served.state / f"report-{token}.json"
    rc, log = run_page(f"{served.url}/?n={N_BROWSER}&token={token}", report)
    assert report.exists(), (
        f"the page never reported (chromium rc {rc}):\n{log}\nserver log:\n{served.log()}"
    )
    result = json.loads(report.read_text())
    _log_is_clean(served)
    assert "error" not in result, result
    assert result["n"] == str(N_BROWSER)
    assert (result["ok"], result["bad"], result["binary"]) == (str(N_BROWSER), "0", str(N_BROWSER // 10))
    assert (result["close"], result["clean"]) == ("1000", "true")
    assert result["extensions"].split(";")[0] == "permessage-deflate"


# --- graceful reload and stop with open WebSockets, real frameworks (refork only) ---


def _open_ws(port: int, path: str):
    from websockets.sync.client import connect

    return connect(f"ws://127.0.0.1:{port}{path}", open_timeout=10, close_timeout=10)


def _closed_with(ws, what: str, timeout: float = 30.0) -> int | None:
    """Wait for the server's close of an idle connection; the code it sent."""
    from websockets.exceptions import ConnectionClosed

    try:
        message = ws.recv(timeout=timeout)
    except ConnectionClosed:
        return ws.close_code
    except TimeoutError:
        raise AssertionError(f"{what}: still open after {timeout}s") from None
    raise AssertionError(f"{what}: got {message!r} instead of a close")


@pytest.mark.parametrize("app", list(APPS))
def test_reload_and_stop_close_open_websockets(app, start_server, tmp_path):
    """HUP: the retiring worker's open WebSockets get 1012 (service restart) and the app's handlers
    see that disconnect; a new connection then works on the new worker. SIGTERM: 1001 (going away),
    and the server exits well within --graceful-timeout instead of waiting on the open sockets."""
    state = tmp_path / "state"
    state.mkdir()
    server = start_server(
        "--graceful-timeout", "60", app=APPS[app], workers=1, env={"WS_STATE_DIR": str(state)}
    )
    _wait_http(server.port, server.proc, server.log_path)
    old = {w["pid"] for w in server.workers()}
    tag = f"r{os.getpid()}"
    with (
        _open_ws(server.port, f"/ws/echo?tag={tag}-reload") as echo,
        _open_ws(server.port, "/ws/room") as room,
    ):
        echo.send("hello ☃")
        assert echo.recv(timeout=10) == "hello ☃"
        assert json.loads(room.recv(timeout=10)) == {"event": "joined"}
        server.signal(signal.SIGHUP)
        assert _closed_with(echo, "echo at reload") == 1012, server.log()
        assert _closed_with(room, "room at reload") == 1012, server.log()
    assert ws_close_seen(state, f"{tag}-reload") == 1012  # what the app's receive() returned
    server.wait_for(
        lambda: (pids := {w["pid"] for w in server.workers()}) and not pids & old,
        60,
        "a new worker replacing the old one",
    )

    with _open_ws(server.port, f"/ws/echo?tag={tag}-stop") as echo:
        echo.send("again")
        assert echo.recv(timeout=10) == "again"
        server.signal(signal.SIGTERM)
        assert _closed_with(echo, "echo at stop") == 1001, server.log()
    assert server.wait_exit(30) == 0, server.log()  # 30 s: half the graceful timeout
    assert ws_close_seen(state, f"{tag}-stop") == 1001


def ws_close_seen(state: Path, tag: str, timeout: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout
    path = state / f"close-{tag}.json"
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"the app never recorded the close of {tag}"
    return json.loads(path.read_text())["code"]
