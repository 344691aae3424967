"""gunicorn's access-log formats: the same requests to a real gunicorn and to refork, the same lines.

gunicorn (the `test` extra installs it) serves tests/apps/access_apps.py's WSGI app with its sync
worker and the ASGI app with its asgi worker; refork serves the same app on every request path
with the same format. The lines must be equal but for the atoms that measure time or name the
process (checked for their shape). The requests are the odd ones: a query with quotes, a
percent-encoded UTF-8 path, quotes, backslashes, a tab and a latin-1 byte in headers, a repeated
header, no Referer, HTTP/1.0, a 404, a 204, a chunked (streamed) body, HEAD, Basic auth, a POST.
On an HTTP/2 path they go in HTTP/2 (the same fields, as an HTTP/2 client sends them); gunicorn
serves no HTTP/2, so refork's line is compared with gunicorn's with HTTP/2.0 as the protocol.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from contextlib import closing

import pytest
from conftest import TESTS, free_port, read_to_end
from support.h2client import H2Client
from support.request_paths import PATHS, connect, flags, http2, tls

from refork.config import ConfigError, load_config
from refork.http.events import Request
from refork.log_format import GUNICORN_DEFAULT, compile_format
from refork.logs import AccessLog

# Every atom; the time and pid atoms last, after a "|[" that the comparison cuts at.
FORMAT = (
    '%(h)s|%(l)s|%(u)s|"%(r)s"|%(m)s|%(U)s|%(q)s|%(H)s|%(s)s|%(B)s|%(b)s|"%(f)s"|"%(a)s"|%({x-odd}i)s|'
    "%({X-Dup}i)s|%({x-quote}o)s|%({content-type}o)s|%({missing}o)s|%({HTTP_X_ODD}e)s|"
    "%({request_method}e)s|%({path_info}e)s|%({nothere}e)s|%(nosuch)s|%%|%(t)s %(T)s %(M)s %(D)s %(L)s %(p)s"
)
STAMP = r"\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]"
TIMES = re.compile(STAMP + r" (\d+) (\d+) (\d+) (\d+\.\d{6}) <(\d+)>")

REQUESTS = [
    b"GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: curl/8\r\nReferer: http://r/\r\n",
    b'GET /q?a=1&b=%20"x"&c HTTP/1.1\r\nHost: x\r\n',
    b"GET /caf%C3%A9/%E2%9C%93?x=%C3%A9 HTTP/1.1\r\nHost: x\r\n",
    b'GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: a "quoted" \\back\\slash\r\nX-Odd: tab\there "q"\r\n'
    b"X-Dup: 1\r\nX-Dup: 2\r\n",
    b"GET /missing HTTP/1.0\r\n",
    b"GET /stream HTTP/1.1\r\nHost: x\r\n",
    b"HEAD / HTTP/1.1\r\nHost: x\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic dXNlcjpwYXNz\r\n",
    b"GET /empty HTTP/1.1\r\nHost: x\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Odd: caf\xe9\r\nReferer: a\r\nReferer: b\r\n",
    b"POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n",
]



def over_http2(raw: bytes) -> bool:
    """Whether an HTTP/2 client may send this request as it is: a raw '"' in a query is not a
    valid :path (RFC 3986; the h2 crate resets such a stream, as hyper and granian do)."""
    return b'"' not in raw.split(b" ")[1].partition(b"?")[2]


def _send_all(port: int, requests: list[bytes] = REQUESTS, path: str | None = None, log=None) -> None:
    """Each request on a connection of its own (gunicorn's sync worker closes after each), as the
    request path's clients connect (over TLS on a TLS path, in HTTP/2 on an HTTP/2 path); with
    `log`, each request's line awaited before the next is sent (the lines in the requests' order)."""
    if path and http2(path):
        requests = [raw for raw in requests if over_http2(raw)]
    for i, raw in enumerate(requests):
        body = b"hello" if raw.startswith(b"POST") else b""
        if path and http2(path):
            with closing(H2Client(port, timeout=10, tls=tls(path))) as client:
                method, target, fields = _as_http2(raw)
                status, _ = client.request(method, target, body, fields)
            assert status in (200, 204, 404)
        else:
            head = raw if raw.startswith(b"GET /missing") else raw + b"Connection: close\r\n"
            sock = connect(path, port) if path else socket.create_connection(("127.0.0.1", port), timeout=10)
            with sock:
                sock.sendall(head + b"\r\n" + body)
                assert read_to_end(sock).startswith(b"HTTP/1.")
        if log is not None:
            _lines(log, i + 1)


def _as_http2(raw: bytes) -> tuple[str, str, list[tuple[bytes, bytes]]]:
    """(method, target, fields) of a request of REQUESTS as an HTTP/2 client sends it: names in
    lower case, no Host (the client's :authority) and no Content-Length (the client's own)."""
    line, *lines = raw.split(b"\r\n")
    method, target, _ = line.decode("latin-1").split(" ")
    fields = [(name.lower(), value) for name, _, value in (f.partition(b": ") for f in lines if f)]
    return method, target, [(n, v) for n, v in fields if n not in (b"host", b"content-length")]


def _over_http2(line: str) -> str:
    """gunicorn's line (FORMAT) for the same request over HTTP/2. gunicorn serves no HTTP/2, so its
    line for the same fields with HTTP/2.0 as the protocol: in "%(r)s" and %(H)s."""
    fields = line.split("|")
    assert fields[3].endswith((' HTTP/1.1"', ' HTTP/1.0"')) and fields[7] in ("HTTP/1.1", "HTTP/1.0"), line
    fields[3], fields[7] = fields[3][: -len('HTTP/1.1"')] + 'HTTP/2.0"', "HTTP/2.0"
    return "|".join(fields)


def _lines(path, count: int) -> list[str]:
    """The access log's lines once it has `count` of them."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text(encoding="utf-8").splitlines()
            if len(lines) >= count:
                return lines
        time.sleep(0.05)
    raise AssertionError(f"{path} has not {count} lines: {path.read_text() if path.exists() else 'no file'}")


def _run_gunicorn(tmp, interface: str, args: list[str]) -> list[str]:
    port = free_port()
    log = tmp / f"gunicorn-{interface}-{port}.log"
    worker = ["-k", "asgi"] if interface == "asgi" else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", *worker,
         "--access-logfile", str(log), *args, f"apps.access_apps:{interface}"],
        cwd=TESTS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "gunicorn exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.05)
        _send_all(port)
        return _lines(log, len(REQUESTS))
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.fixture(scope="module")
def gunicorn_lines(tmp_path_factory):
    """gunicorn's lines for the WSGI and the ASGI app, with FORMAT and with its default format."""
    tmp = tmp_path_factory.mktemp("gunicorn")
    runs: dict[tuple[str, str], list[str]] = {}

    def lines(interface: str, fmt: str) -> list[str]:
        if (interface, fmt) not in runs:
            args = ["--access-logformat", fmt] if fmt != "default" else []
            runs[interface, fmt] = _run_gunicorn(tmp, interface, args)
        return runs[interface, fmt]

    return lines


def _refork_lines(start_server, tmp_path, path: str, args: list[str]) -> list[str]:
    chosen, app = flags(path, "apps.access_apps")
    log = tmp_path / f"refork-{path}.log"
    server = start_server(*chosen, "--access-logfile", str(log), *args, app=app, workers=1)
    _send_all(server.port, path=path, log=log)
    return _lines(log, len([raw for raw in REQUESTS if over_http2(raw)] if http2(path) else REQUESTS))


@pytest.mark.parametrize("path", list(PATHS))
def test_every_atom_matches_gunicorn(path, start_server, tmp_path, gunicorn_lines):
    ours = _refork_lines(start_server, tmp_path, path, ["--access-logformat", FORMAT])
    theirs = gunicorn_lines(PATHS[path][0], FORMAT)
    if http2(path):
        theirs = [_over_http2(line) for line, raw in zip(theirs, REQUESTS, strict=True) if over_http2(raw)]
    assert [line.partition("|[")[0] for line in ours] == [line.partition("|[")[0] for line in theirs]
    for line in ours:
        stamp = "[" + line.partition("|[")[2]
        m = TIMES.fullmatch(stamp)
        assert m, stamp
        seconds, millis, micros, decimal, _pid = m.groups()
        assert int(millis) == int(micros) // 1000 and int(seconds) == int(micros) // 1_000_000
        assert decimal == f"{int(micros) // 1_000_000}.{int(micros) % 1_000_000:06d}"


@pytest.mark.parametrize("path", ["engine", "asyncio"])
def test_default_format_is_gunicorns(path, start_server, tmp_path, gunicorn_lines):
    """No --access-logformat: gunicorn's default lines (the date aside)."""
    ours = _refork_lines(start_server, tmp_path, path, [])
    theirs = gunicorn_lines(PATHS[path][0], "default")
    date = re.compile(r" \[\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\] ")
    assert [date.sub(" [date] ", line) for line in ours] == [date.sub(" [date] ", line) for line in theirs]
    assert ours[0].endswith(' "GET / HTTP/1.1" 200 6 "http://r/" "curl/8"')


def test_refork_formats_and_the_flag_spellings(start_server, tmp_path):
    """common, combined and json stay refork's; --access-log-format and --access-logformat are one."""
    for flag, fmt in (("--access-log-format", "combined"), ("--access-logformat", "json")):
        log = tmp_path / f"{fmt}.log"
        server = start_server("--access-logfile", str(log), flag, fmt, app="apps.access_apps:wsgi", workers=1)
        _send_all(server.port, REQUESTS[:1])
        (line,) = _lines(log, 1)
        if fmt == "combined":
            expected = rf'127\.0\.0\.1 - - {STAMP} "GET / HTTP/1\.1" 200 6 "http://r/" "curl/8"'
            assert re.fullmatch(expected, line)
        else:
            assert '"path":"/"' in line and '"user_agent":"curl/8"' in line


@pytest.mark.parametrize(
    "fmt, error",
    [
        ("%(h)d", "real number"),  # Python's own words, which 3.15 rephrased
        ("%(h)s %s", "'%s' names no atom"),
        ("%(h", "unsupported %-directive"),
        ("%(h)s %(T)*d", "a '*' width takes no atom"),
        ("   ", "an empty format"),
        ("apache", 'no atom in "apache"'),
    ],
)
def test_a_bad_format_is_a_config_error(fmt, error):
    with pytest.raises(ConfigError) as e:
        load_config(["--access-logformat", fmt, "app:app"], environ={})
    assert error in str(e.value) and "--access-log" in str(e.value)


def test_the_config_file_name_and_default():
    assert load_config(["app:app"], environ={}).access_log_format == GUNICORN_DEFAULT
    config = load_config(["--access-logformat", "COMBINED", "app:app"], environ={})
    assert config.access_log_format == "combined"


def test_atoms_without_a_server():
    """What the lines above cannot show: a missing remote, a failed Basic decoding, {var}e on the
    ASGI loop (gunicorn's minimal environ), non-str environ values."""
    request = Request("GET", b"/a?b", b"/a", b"b", "1.0", [(b"authorization", b"Basic !!!"), (b"x-y", b"z")])
    line = compile_format("%(h)s %(u)s %({wsgi.version}e)s %({HTTP_X_Y}e)s %(H)s")
    environ = {"wsgi.version": (1, 0), "HTTP_X_Y": "z"}
    assert line(request, None, 200, 0, 0.0, environ, None) == "- - (1, 0) z HTTP/1.0"
    asgi = compile_format("%({http_x_y}e)s %({remote_addr}e)s %({path_info}e)s", asgi=True)
    assert asgi(request, "10.0.0.1", 200, 0, 0.0, None, None) == "z 10.0.0.1 /a"


def test_the_static_atom_says_a_mount_answered(tmp_path):
    """``%(static)s``: ``static`` for a request a --static mount answered (any under its prefix but
    a WebSocket handshake), ``-`` for the app's; always ``-`` without mounts."""
    fmt = "%(static)s %(s)s"
    args = ["--access-logformat", fmt, "--access-logfile", str(tmp_path / "a.log"), "app:app"]
    line = AccessLog.from_config(load_config(["--static", f"/assets={tmp_path}", *args], environ={})).line
    no_mounts = AccessLog.from_config(load_config(args, environ={})).line
    paths = (b"/assets/a.css", b"/assets", b"/assetsx", b"/")
    requests = [Request("GET", p, p, b"", "1.1", []) for p in paths]
    requests.append(Request("GET", b"/assets/ws", b"/assets/ws", b"", "1.1", [], websocket=True))
    logged = [(line(r, None, 200, 0, 0.0, None, None), no_mounts(r, None, 200, 0, 0.0, None, None))
              for r in requests]  # fmt: skip
    assert [mounted for mounted, _ in logged] == ["static 200", "static 200", "- 200", "- 200", "- 200"]
    assert {unmounted for _, unmounted in logged} == {"- 200"}


@pytest.mark.parametrize(
    ("args", "fmt"),
    [
        (["-k", "uvicorn.workers.UvicornWorker"], "uvicorn"),
        (["-k", "uvicorn_worker.UvicornH11Worker"], "uvicorn"),
        (["-k", "uvicorn.workers.UvicornWorker", "--access-logformat", "%(h)s %(s)s"], "%(h)s %(s)s"),
        (["-k", "asgi"], GUNICORN_DEFAULT),
        (["--access-logformat", "uvicorn"], "uvicorn"),
    ],
)
def test_a_uvicorn_worker_logs_uvicorns_line_unless_a_format_is_given(args, fmt):
    config = load_config([*args, "--access-logfile", "-", "app:app"], environ={})
    assert config.access_log_format == fmt
    said = [line for _, line in config.notes if "uvicorn's line" in line]
    assert len(said) == (fmt == "uvicorn" and "-k" in args)


def test_uvicorns_line_without_a_server():
    """uvicorn's message: the query after "?", a quote as %22, HTTP/2 as its scope says "2", a
    unix-socket client as nothing."""
    line = compile_format("uvicorn")
    request = Request("POST", b'/a"b?x=1', b'/a"b', b"x=1", "1.1", [])
    assert line(request, "10.0.0.1", 201, 5, 0.1, None, None) == '10.0.0.1 - "POST /a%22b?x=1 HTTP/1.1" 201'
    over_h2 = Request("GET", b"/", b"/", b"", "2.0", [])
    assert line(over_h2, None, 200, 0, 0.0, None, None) == ' - "GET / HTTP/2" 200'
