"""Value parsers for gunicorn's process and logging settings that refork implements
(refork.config.process_settings): the worker class, the user, group and umask, the environment,
secure scheme headers, logconfig_dict and syslog. Same contract as refork.config.coercers.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from refork.config.coercers import got, integer, string
from refork.errors import ConfigError

WSGI_THREADS, ASGI, GREEN = "threads", "asgi", "green"
WORKER_CLASSES = {
    "sync": WSGI_THREADS,
    "gthread": WSGI_THREADS,
    "gunicorn.workers.sync.SyncWorker": WSGI_THREADS,
    "gunicorn.workers.gthread.ThreadWorker": WSGI_THREADS,
    "asgi": ASGI,
    "gunicorn.workers.gasgi.ASGIWorker": ASGI,
    "uvicorn.workers.UvicornWorker": ASGI,
    "uvicorn.workers.UvicornH11Worker": ASGI,
    "uvicorn_worker.UvicornWorker": ASGI,
    "uvicorn_worker.UvicornH11Worker": ASGI,
    "gevent": GREEN,
    "gevent_wsgi": GREEN,
    "gevent_pywsgi": GREEN,
    "eventlet": GREEN,
    "tornado": GREEN,
    "gunicorn.workers.ggevent.GeventWorker": GREEN,
    "gunicorn.workers.ggevent.GeventPyWSGIWorker": GREEN,
    "gunicorn.workers.geventlet.EventletWorker": GREEN,
    "gunicorn.workers.gtornado.TornadoWorker": GREEN,
}


def worker_class(value: Any, where: str) -> str:
    """-k: a name or class path gunicorn knows (``egg:gunicorn#gevent`` too), or a class object."""
    if isinstance(value, type):
        value = f"{value.__module__}.{value.__qualname__}"
    text = string(value, where).strip()
    if text.startswith("egg:gunicorn#"):
        text = text[len("egg:gunicorn#") :]
    if text not in WORKER_CLASSES:
        known = "sync, gthread, uvicorn.workers.UvicornWorker, gevent, eventlet, tornado"
        raise ConfigError(
            f"{where}: refork cannot run worker class {text!r}: it serves WSGI apps on threads and "
            f"ASGI apps on asyncio; use one of {known} (or drop -k)"
        )
    return text


def optional_positive_int(value: Any, where: str) -> int | None:
    if value is None or value == "":
        return None
    return integer(1)(value, where)


def _id(value: Any, where: str, what: str, lookup: Callable[[str], int]) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = string(value, where).strip()
    if text.isdigit():
        return text
    try:
        lookup(text)
    except KeyError:
        raise ConfigError(f"{where}: no such {what}: {text!r}") from None
    return text


def user(value: Any, where: str) -> str | None:
    """-u: a user name or uid, checked to exist; None: no switch."""
    import pwd

    return _id(value, where, "user", lambda name: pwd.getpwnam(name).pw_uid)


def group(value: Any, where: str) -> str | None:
    import grp

    return _id(value, where, "group", lambda name: grp.getgrnam(name).gr_gid)


def umask(value: Any, where: str) -> int | None:
    """gunicorn's auto_int: 18, "0o22", "022" (a leading 0 is octal), "0x12"; None: unchanged."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value.strip()
        if re.match(r"0\d", text):
            text = "0o" + text[1:]
        try:
            value = int(text, 0)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise ConfigError(f"{where} must be a file mode mask like 0o022, 022 or 18, got {got(value)}")
    return value


def file_umask(value: Any, where: str) -> int | None:
    """umask in a config file, as gunicorn's validator reads it there: a string is int(text, 0),
    so "007" (a leading 0, which Python does not read as octal) is refused as gunicorn refuses it,
    rather than taken as octal as the command line's -m 007 is."""
    if isinstance(value, str) and value.strip():
        try:
            int(value, 0)
        except ValueError:
            raise ConfigError(f"{where} must be a number Python reads, got {got(value)} (gunicorn refuses it "
                              f"too: write 0o{value.strip()} for octal)") from None  # fmt: skip
    return umask(value, where)


def env_assignments(value: Any, where: str) -> list[str]:
    """raw_env: KEY=VALUE entries; an empty entry is refused as gunicorn refuses it at start."""
    if isinstance(value, (list, tuple)):
        return [env_assignment(item, where) for item in value]
    return [env_assignment(item, where) for item in string(value, where).split(",") if item.strip()]


def env_assignment(value: Any, where: str) -> str:
    text = string(value, where).strip()
    if "=" not in text or not text.partition("=")[0]:
        raise ConfigError(f"{where} must be KEY=VALUE, got {got(text)}")
    return text


def secure_scheme_headers(value: Any, where: str) -> dict[str, str]:
    """gunicorn's dict of upper-case header names to the value that means https; or NAME=VALUE
    items (the command line, an environment variable: comma-separated)."""
    if isinstance(value, str):
        value = [item for item in value.split(",") if item.strip()]
    if isinstance(value, (list, tuple)):
        items = {}
        for item in value:
            name, eq, expected = string(item, where).partition("=")
            if not eq or not name.strip():
                raise ConfigError(f"{where} must be NAME=VALUE items, got {got(item)}")
            items[name.strip()] = expected.strip()
        value = items
    strings = isinstance(value, dict) and all(isinstance(x, str) for pair in value.items() for x in pair)
    if not strings:
        raise ConfigError(f"{where} must be a dict of header names to values, got {got(value)}")
    return {name.strip().upper(): expected for name, expected in value.items()}


def log_dict(value: Any, where: str) -> dict[str, Any]:
    """logconfig_dict: a dict (a config file) or its JSON (a flag, an environment variable)."""
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as e:
            raise ConfigError(f"{where} must be a logging dictConfig dict or its JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a logging dictConfig dict, got {got(value)}")
    return value


def syslog_address(value: Any, where: str) -> str:
    """unix://PATH[#dgram|#stream], udp://HOST:PORT or tcp://HOST:PORT (gunicorn's forms)."""
    text = string(value, where).strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme not in ("unix", "udp", "tcp") or not rest:
        raise ConfigError(f"{where} must be unix://PATH, udp://HOST:PORT or tcp://HOST:PORT, got {got(text)}")
    return text


def syslog_facility(value: Any, where: str) -> str:
    from logging.handlers import SysLogHandler

    text = string(value, where).strip().lower()
    if text not in SysLogHandler.facility_names:
        raise ConfigError(f"{where} must be a syslog facility like user, daemon or local0, got {got(text)}")
    return text
