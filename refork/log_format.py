"""Access-log formats: gunicorn's ``%(h)s``-style format strings, and refork's common, combined, json.

:func:`compile_format` turns a format into a *line function* once, at start-up; the loops call it
per response with what they have at hand::

    line(request, remote, status, length, duration, environ, response_headers) -> str

(`request` a refork.http.events.Request, `remote` the client address or None, `length` the body
bytes sent, `duration` seconds, `environ` the WSGI environ or None (ASGI), `response_headers` the
app's (name, value) byte pairs or None).

A gunicorn format is compiled to a function that computes just the atoms it names into locals
and joins them with one f-string (a ``%s`` field is an f-string field; any other spec is applied
with % to its atom), each atom computed as gunicorn's ``Logger.atoms`` computes it: same values,
same defaults (``-``), same escaping (a ``"`` in a string atom becomes ``\\"``, nothing else),
same case rules (``{name}i``/``o``/``e`` case-insensitive, the other atoms exact). The built-in
formats escape Apache-style instead (quotes, backslashes and non-printable bytes as ``\\xNN``).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote_to_bytes

LineFunction = Callable[[Any, "str | None", int, int, float, "dict[str, Any] | None", Any], str]

BUILT_IN = ("common", "combined", "json", "uvicorn")
GUNICORN_DEFAULT = '%(h)s %(l)s %(u)s %(t)s "%(r)s" %(s)s %(b)s "%(f)s" "%(a)s"'
"""gunicorn's default access_log_format (Apache's combined format with the user)."""

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_UNSAFE = re.compile(r'["\\\x00-\x1f\x7f-\xff]')
# One %-directive, as Python's printf-style formatting reads it (the key without nested parens).
_DIRECTIVE = re.compile(
    r"%(?:\((?P<key>[^()]*)\))?"
    r"(?P<spec>[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?(?P<conv>[diouxXeEfFgGcrsa%]))"
)


class FormatError(ValueError):
    """A format string that cannot be used (the message says why, for a one-line config error)."""


# ------------------------------------------------------------------------------------------------
# Shared pieces (the generated code calls these)
# ------------------------------------------------------------------------------------------------

_stamp: list[Any] = [-1, ""]  # (second, "[22/Nov/2026:12:00:00 +0000]"): one list, swapped whole


def clf_time(now: float) -> str:
    """``[22/Nov/2026:12:00:00 +0000]`` in local time (English month), formatted once per second."""
    second = int(now)
    stamp = _stamp
    if stamp[0] != second:
        t = time.localtime(second)
        text = time.strftime(f"[%d/{_MONTHS[t.tm_mon - 1]}/%Y:%H:%M:%S %z]", t)
        _stamp[:] = [second, text]
        return text
    return str(stamp[1])


_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def basic_user(value: bytes | None) -> str:
    """The user of an ``Authorization: Basic`` value, or ``-`` (gunicorn's _get_user, lenient)."""
    if value is None:
        return "-"
    auth = value.decode("latin-1")
    if not auth.lower().startswith("basic"):
        return "-"
    parts = auth.split(" ", 1)
    if len(parts) != 2:
        return "-"
    try:
        user = base64.b64decode(parts[1].strip().encode("utf-8")).split(b":", 1)[0].decode("utf-8")
    except (TypeError, binascii.Error, UnicodeDecodeError):
        return "-"
    return user.replace('"', '\\"') or "-"


def _header(headers: Any, name: bytes) -> str:
    """The last value of a request or response header (names compared case-insensitively), or -."""
    found = None
    for n, v in headers or ():
        if n == name or n.lower() == name:
            found = v
    return "-" if found is None else found.decode("latin-1").replace('"', '\\"')


def _environ_value(environ: dict[str, Any], name: str) -> Any:
    """gunicorn's ``{name}e``: the environ key equal to `name` lower-cased (the last such), or -."""
    found: Any = "-"
    for key, value in environ.items():
        if key.lower() == name:
            found = value.replace('"', '\\"') if isinstance(value, str) else value
    return found


def asgi_environ(request: Any, remote: str | None) -> dict[str, Any]:
    """The WSGI-like environ gunicorn's ASGI worker logs with (``{name}e`` on the ASGI loop)."""
    environ = {
        "REQUEST_METHOD": request.method,
        "RAW_URI": request.target.decode("latin-1"),
        "PATH_INFO": unquote_to_bytes(request.path).decode("utf-8", "replace"),
        "QUERY_STRING": request.query.decode("latin-1"),
        "SERVER_PROTOCOL": "HTTP/" + request.http_version,
        "REMOTE_ADDR": remote or "-",
    }
    for name, value in request.headers:
        environ["HTTP_" + name.decode("latin-1").upper().replace("-", "_")] = value.decode("latin-1")
    return environ


def _asgi_path(request: Any) -> str:
    """``U`` on the ASGI loop: the path as ASGI's scope has it (percent-decoded UTF-8)."""
    return unquote_to_bytes(request.path).decode("utf-8", "replace").replace('"', '\\"')


def _path_info(request: Any, environ: dict[str, Any] | None) -> str:
    if environ is not None:
        path = environ.get("PATH_INFO")
        return "-" if path is None else str(path).replace('"', '\\"')
    return unquote_to_bytes(request.path).decode("latin-1").replace('"', '\\"')


# ------------------------------------------------------------------------------------------------
# gunicorn's atoms
# ------------------------------------------------------------------------------------------------

# Each atom: the expression that computes it in the generated line function (see _generate), with
# `req`, `remote`, `status`, `length`, `duration`, `environ`, `rh` (response headers) in scope and
# `us` (the duration in whole microseconds) when a time atom needs it.
_ATOM_EXPRESSIONS = {
    "h": "'-' if remote is None else remote",  # gunicorn's REMOTE_ADDR: '' for a unix-socket peer
    "l": "'-'",
    "t": "_clf_time(_time())",
    "r": "(req.method + ' ' + req.target.decode('latin-1') + ' HTTP/' + req.http_version)"
    ".replace('\"', '\\\\\"')",
    "s": "status",
    "m": "req.method",
    "U": "_path_info(req, environ)",
    "q": "req.query.decode('latin-1').replace('\"', '\\\\\"')",
    "H": "'HTTP/' + req.http_version",
    "B": "length",
    "b": "length",
    "T": "us // 1000000",
    "D": "us",
    "M": "us // 1000",
    "L": "'%d.%06d' % divmod(us, 1000000)",
    "p": "'<%d>' % _pid[0]",
}
# Atoms read from a request header: gunicorn reads these from the environ, where repeated fields
# are joined with "," (``{name}i`` reads the header list: the last one wins).
_FROM_HEADERS = {"u": b"authorization", "f": b"referer", "a": b"user-agent"}

_SAMPLE: dict[str, Any] = {"s": 200, "B": 0, "T": 0, "D": 0, "M": 0}  # for validation: the int atoms


class _Probe(dict):  # type: ignore[type-arg]
    """Any key: a value of the type the line function will give it (str, or int for the counts)."""

    def __missing__(self, key: str) -> Any:
        return _SAMPLE.get(key, "-")


Piece = str | tuple[str, str]  # literal text, or (atom, %-spec without the "%")


def _directives(fmt: str) -> list[Piece]:
    """The format as literal text and ``%(key)spec`` directives, in order."""
    out: list[Piece] = []
    at = 0
    while True:
        i = fmt.find("%", at)
        if i < 0:
            out.append(fmt[at:])
            break
        out.append(fmt[at:i])
        m = _DIRECTIVE.match(fmt, i)
        if m is None:
            raise FormatError(f"unsupported %-directive at {fmt[i:i + 8]!r}")
        key, spec = m.group("key"), m.group("spec")
        if key is None:
            if spec != "%":
                raise FormatError(f"{m.group()!r} names no atom: write it like %(h)s")
            out.append("%")
        else:
            if "*" in spec:
                raise FormatError(f"{m.group()!r}: a '*' width takes no atom")
            out.append((key, spec))
        at = m.end()
    return out


def _atom_code(key: str, headers: dict[bytes, str], joined: dict[bytes, str], asgi: bool,
               static: bool) -> str:  # fmt: skip
    """The expression of one atom; `headers`/`joined` collect the request header variables needed;
    `static`: there are --static mounts."""
    if asgi and key == "U":
        return "_asgi_path(req)"
    if key == "static":  # refork's own: a --static mount answered
        return "'static' if _static(req) else '-'" if static else "'-'"
    if key in _ATOM_EXPRESSIONS:
        return _ATOM_EXPRESSIONS[key]
    if key in _FROM_HEADERS:
        name = _FROM_HEADERS[key]
        if asgi:  # gunicorn's ASGI worker: the last field of a name, as for {name}i
            var = headers.setdefault(name, f"i{len(headers)}")
        else:
            var = joined.setdefault(name, f"j{len(joined)}")
        if key == "u":
            return f"'-' if {var} is None else _basic_user({var})"
        return f"'-' if {var} is None else {var}.decode('latin-1').replace('\"', '\\\\\"')"
    if key.startswith("{") and len(key) > 3 and key[-2] == "}":
        atom, kind = key[1:-2].lower(), key[-1].lower()
        field = atom.encode()  # (a field name is ASCII: any other name matches no field)
        if kind == "i":
            var = headers.setdefault(field, f"i{len(headers)}")
            return f"'-' if {var} is None else {var}.decode('latin-1').replace('\"', '\\\\\"')"
        if kind == "o":
            return f"_header(rh, {field!r})"
        if kind == "e":
            return f"_environ_value(environ if environ is not None else _asgi_environ(req, remote), {atom!r})"
    return "'-'"  # gunicorn: an unknown atom is "-"


def _generate(fmt: str, asgi: bool, static: tuple[bytes, ...] = ()) -> LineFunction:
    """The line function's source: each atom computed into a local, then one f-string (``%s`` is
    str(), as an f-string's field; any other spec is applied with %)."""
    pieces = _directives(fmt)
    headers: dict[bytes, str] = {}
    joined: dict[bytes, str] = {}
    keys = [p[0] for p in pieces if isinstance(p, tuple)]
    body = ["def line(req, remote, status, length, duration, environ, rh):"]
    if any(key in ("T", "D", "M", "L") for key in keys):
        body.append("    us = int(duration * 1000000)")
    values: list[str] = []
    parts: list[str] = []
    for piece in pieces:
        if isinstance(piece, str):
            if piece:
                parts.append(repr(piece))
            continue
        key, spec = piece
        code = _atom_code(key, headers, joined, asgi, bool(static))
        if code == "'-'" and spec == "s":  # l, unknown atoms: constant
            parts.append("'-'")
            continue
        var = f"v{len(values)}"
        values.append(f"    {var} = {code}" if spec == "s" else f"    {var} = {'%' + spec!r} % ({code},)")
        parts.append(f'f"{{{var}}}"')
    if headers or joined:
        body.append("    " + " = ".join([*headers.values(), *joined.values()]) + " = None")
        body.append("    for n, v in req.headers:")
        branch = "if"
        for name, var in headers.items():
            body.append(f"        {branch} n == {name!r}: {var} = v")
            branch = "elif"
        for name, var in joined.items():
            join = f"{var} = v if {var} is None else {var} + b',' + v"
            if name in headers:  # (read by both: the last value, and the joined one)
                body.append(f"        if n == {name!r}: {join}")
            else:
                body.append(f"        {branch} n == {name!r}: {join}")
                branch = "elif"
    body += values
    body.append(f"    return {' '.join(parts) or repr('')}")
    scope: dict[str, Any] = {
        "_clf_time": clf_time,
        "_time": time.time,
        "_pid": _pid,
        "_path_info": _path_info,
        "_asgi_path": _asgi_path,
        "_basic_user": basic_user,
        "_header": _header,
        "_environ_value": _environ_value,
        "_asgi_environ": asgi_environ,
        "_static": static_test(static),
    }
    exec("\n".join(body), scope)  # noqa: S102 - our own code, from a parsed format
    line: LineFunction = scope["line"]
    return line


# ------------------------------------------------------------------------------------------------
# refork's built-in formats
# ------------------------------------------------------------------------------------------------


def _escape_char(m: re.Match[str]) -> str:
    c = m.group()
    return "\\" + c if c in '"\\' else f"\\x{ord(c):02x}"


def clean(text: str) -> str:
    """Apache-style escaping so a client cannot forge log lines or break quoting."""
    return _UNSAFE.sub(_escape_char, text) if _UNSAFE.search(text) else text


def _referer_and_agent(headers: list[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    referer = agent = None
    for name, value in headers:
        if name == b"referer":
            referer = value.decode("latin-1")
        elif name == b"user-agent":
            agent = value.decode("latin-1")
    return referer, agent


def _common(req: Any, remote: str | None, status: int, length: int, duration: float,
            environ: Any, rh: Any) -> str:  # fmt: skip
    target = clean(req.target.decode("latin-1"))
    return (
        f'{remote or "-"} - - {clf_time(time.time())} "{clean(req.method)} {target} '
        f'HTTP/{req.http_version}" {status} {length or "-"}'
    )


def _combined(req: Any, remote: str | None, status: int, length: int, duration: float,
              environ: Any, rh: Any) -> str:  # fmt: skip
    referer, agent = _referer_and_agent(req.headers)
    return (
        _common(req, remote, status, length, duration, environ, rh)
        + f' "{clean(referer) if referer else "-"}" "{clean(agent) if agent else "-"}"'
    )


def _json(req: Any, remote: str | None, status: int, length: int, duration: float,
          environ: Any, rh: Any) -> str:  # fmt: skip
    referer, agent = _referer_and_agent(req.headers)
    now = time.time()
    path, _, query = req.target.decode("utf-8", "backslashreplace").partition("?")
    return json.dumps(
        {
            "ts": f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(now))}.{int(now % 1 * 1e3):03d}Z",
            "remote": remote or "-",
            "method": req.method,
            "path": path,
            "query": query,
            "proto": "HTTP/" + req.http_version,
            "status": status,
            "bytes": length,
            "duration_ms": round(duration * 1000, 3),
            "referer": referer,
            "user_agent": agent,
            "pid": _pid[0],
        },
        separators=(",", ":"),
    )


def _uvicorn(req: Any, remote: str | None, status: int, length: int, duration: float,
             environ: Any, rh: Any) -> str:  # fmt: skip
    """uvicorn's access line as gunicorn's UvicornWorker writes it (its message, without uvicorn's
    level prefix and reason phrase): ``127.0.0.1 - "GET /a?b=1 HTTP/1.1" 200``; the client
    without its port, which refork's line functions do not get."""
    target = req.path.decode("latin-1")
    if req.query:
        target += "?" + req.query.decode("latin-1")
    version = "2" if req.http_version == "2.0" else req.http_version  # the ASGI scope's spelling
    return f'{remote or ""} - "{req.method} {target.replace(chr(34), "%22")} HTTP/{version}" {status}'


_BUILT_IN: dict[str, LineFunction] = {
    "common": _common, "combined": _combined, "json": _json, "uvicorn": _uvicorn,
}  # fmt: skip


def static_test(prefixes: tuple[bytes, ...]) -> Callable[[Any], bool]:
    """Whether a --static mount (one of `prefixes`) answered a request: it answers every request
    under it but a WebSocket handshake."""
    under = tuple(p + b"/" for p in prefixes)

    def answered(req: Any) -> bool:
        path = req.path
        return not req.websocket and (path in prefixes or path.startswith(under))

    return answered


def _with_static_field(line: LineFunction, static: Callable[[Any], bool]) -> LineFunction:
    """The json format with ``"static"``: true when a --static mount answered."""

    def static_line(req: Any, remote: str | None, status: int, length: int, duration: float,
                    environ: Any, rh: Any) -> str:  # fmt: skip
        return line(req, remote, status, length, duration, environ, rh)[:-1] + (
            ',"static":true}' if static(req) else ',"static":false}'
        )

    return static_line


def check_format(fmt: str) -> str:
    """`fmt` when it is usable: a built-in name, or a gunicorn format (FormatError says why not)."""
    if fmt in _BUILT_IN:
        return fmt
    if not fmt.strip():
        raise FormatError("an empty format")
    if not any(isinstance(piece, tuple) for piece in _directives(fmt)):
        raise FormatError("no atom")
    try:
        fmt % _Probe()  # noqa: B018 - Python's own verdict on the directives and the atoms' types
    except (TypeError, ValueError, KeyError) as e:
        raise FormatError(str(e)) from None
    return fmt


def compile_format(fmt: str, asgi: bool = False, static: tuple[bytes, ...] = ()) -> LineFunction:
    """The line function of a built-in format name or a gunicorn format string; `asgi`: as
    gunicorn's ASGI worker logs (``U`` decoded as UTF-8, a repeated field's last value); `static`:
    the --static mounts' prefixes (json's ``"static"`` field, the ``static`` atom)."""
    built_in = _BUILT_IN.get(fmt)
    if built_in is not None:
        return _with_static_field(built_in, static_test(static)) if static and fmt == "json" else built_in
    check_format(fmt)
    return _generate(fmt, asgi, static)

