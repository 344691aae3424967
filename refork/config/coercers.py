"""Value parsers for settings: raw value + where it came from -> a checked value, or one ConfigError line.

Every source (flag, environment, pyproject.toml, config file) goes through the same coercer, so a
bad value reads the same wherever it came from; only the "where" part differs.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any, Literal, TypeVar, get_args

from refork.addresses import BIND_SYNTAX, STATSD_SYNTAX, parse_bind, parse_statsd
from refork.errors import ConfigError
from refork.http.forwarded import parse_proxy
from refork.integrations import NAMES
from refork.log_format import BUILT_IN, FormatError, check_format

T = TypeVar("T")
Coercer = Callable[[Any, str], T]
"""(raw value, where it came from) -> the validated value."""

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def got(value: object) -> str:
    """A bad value as error messages quote it: strings in double quotes, the rest as repr."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def integer(minimum: int, what: str | None = None) -> Coercer[int]:
    what = what or ("a positive integer" if minimum == 1 else f"an integer >= {minimum}")

    def coerce(value: Any, where: str) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{where} must be {what}, got {got(value)}")
        return value

    return coerce


def _seconds(value: Any) -> float | None:
    """A finite number of seconds from a number or a numeric string; None if it is not one."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isinf(value) or value != value:
        return None
    return float(value)


def positive_seconds(value: Any, where: str) -> float:
    """Timeouts and intervals: seconds, strictly positive."""
    seconds = _seconds(value)
    if seconds is None or not seconds > 0:
        raise ConfigError(f"{where} must be a number of seconds > 0, got {got(value)}")
    return seconds


def non_negative_float(value: Any, where: str) -> float:
    """A rate or amount that 0 switches off: a finite number >= 0."""
    number = _seconds(value)
    if number is None or number < 0:
        raise ConfigError(f"{where} must be a number >= 0, got {got(value)}")
    return number


def off_or_seconds(value: Any, where: str) -> float | None:
    """A delay that can be switched off: "off" (or None) -> None, else seconds >= 0."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "")):
        return None
    seconds = _seconds(value)
    if seconds is None or seconds < 0:
        raise ConfigError(f'{where} must be a number of seconds >= 0 or "off", got {got(value)}')
    return seconds


def auto_off_or_seconds(value: Any, where: str) -> float | Literal["auto"] | None:
    """`auto`, or a delay that can be switched off (see off_or_seconds)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return off_or_seconds(value, where)
    except ConfigError:
        raise ConfigError(
            f'{where} must be "auto", a number of seconds >= 0 or "off", got {got(value)}'
        ) from None


class Choice:
    """One of a Literal type's values (case-insensitive); the values are read from the type itself."""

    def __init__(self, literal: Any) -> None:
        self.options: tuple[str, ...] = get_args(literal)

    def __call__(self, value: Any, where: str) -> Any:
        if isinstance(value, str) and value.strip().lower() in self.options:
            return value.strip().lower()
        raise ConfigError(f"{where} must be one of {'|'.join(self.options)}, got {got(value)}")


def string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be a string, got {got(value)}")
    return value


def nonempty_string(value: Any, where: str) -> str:
    text = string(value, where).strip()
    if not text:
        raise ConfigError(f"{where} must not be empty")
    return text


def access_log_format(value: Any, where: str) -> str:
    """A built-in name (any case) or a gunicorn format string, checked by the code that compiles it."""
    text = string(value, where)
    if text.strip().lower() in BUILT_IN:
        return text.strip().lower()
    try:
        return check_format(text)
    except FormatError as e:
        raise ConfigError(f"{where}: {e} in {got(text)} (gunicorn's atoms like %(h)s, or "
                          f"{', '.join(BUILT_IN)})") from None  # fmt: skip


def optional_string(value: Any, where: str) -> str | None:
    """Optional paths: None or an empty string mean "not set"."""
    if value is None or value == "":
        return None
    return string(value, where)


def boolean(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"{where} must be true or false (1/0, yes/no, on/off), got {got(value)}")


def list_of(item: Coercer[T], split_items: bool = True) -> Coercer[list[T]]:
    """A list from a list/tuple or from a comma-separated string (env vars, some flags).

    split_items=False keeps each list item whole (a list from a file or repeated flags) and
    splits only a single string (an environment variable).
    """

    def coerce(value: Any, where: str) -> list[T]:
        if isinstance(value, str):
            parts: list[Any] = value.split(",")
        elif isinstance(value, (list, tuple)):
            parts = []
            for v in value:
                parts.extend(v.split(",") if split_items and isinstance(v, str) else [v])
        else:
            raise ConfigError(f"{where} must be a list or a comma-separated string, got {got(value)}")
        return [item(p.strip() if isinstance(p, str) else p, where) for p in parts if p != ""]

    return coerce


def parse_size(text: str) -> int:
    """'512M' -> 536870912, '1.5G' -> 1610612736: K/M/G/T are powers of 1024 ("B"/"iB" tolerated)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(
            f"invalid size {text!r}: expected a number of bytes with an optional unit "
            "K, M, G or T (powers of 1024), e.g. 512M or 1G"
        )
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def size(value: Any, where: str) -> int:
    if isinstance(value, str):
        try:
            return parse_size(value)
        except ValueError:
            pass
    elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ConfigError(f"{where} must be a size in bytes like 1048576, 512K, 512M or 2G, got {got(value)}")


def cpu_quota(root: str = "/sys/fs/cgroup", cgroup: str | None = None) -> int:
    """CPUs this process may use (what ``--workers auto`` starts): the cgroup CPU quota rounded up,
    capped by the CPUs it may run on (sched_getaffinity), at least 1.

    cgroup v2: the smallest ``cpu.max`` from this process's own cgroup (``/proc/self/cgroup``, e.g.
    a systemd unit's ``CPUQuota=``) up to `root` (a container's quota, seen at its cgroup root);
    v1: ``cpu.cfs_quota_us / cpu.cfs_period_us``.
    """
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        count = os.cpu_count() or 1
    quotas = [q for q in (_v2_quota(os.path.join(root, d, "cpu.max")) for d in _cgroup_dirs(cgroup)) if q]
    if not quotas:
        for sub in ("cpu", "cpu,cpuacct"):
            try:
                with open(os.path.join(root, sub, "cpu.cfs_quota_us")) as f:
                    quota = int(f.read())
                with open(os.path.join(root, sub, "cpu.cfs_period_us")) as f:
                    period = int(f.read())
            except (OSError, ValueError):
                continue
            if quota > 0 and period > 0:
                quotas.append(quota / period)
            break
    if quotas:
        count = min(count, math.ceil(min(quotas)))
    return max(1, count)


def _cgroup_dirs(cgroup: str | None) -> list[str]:
    """This process's cgroup v2 path and its ancestors, relative to the cgroup root, deepest first."""
    if cgroup is None:
        cgroup = "/"
        try:
            with open("/proc/self/cgroup") as f:
                for line in f:
                    if line.startswith("0::"):
                        cgroup = line[3:].strip() or "/"
        except OSError:
            pass
    parts = [p for p in cgroup.split("/") if p and p != ".."]
    return ["/".join(parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quota(path: str) -> float | None:
    """CPUs a cgroup v2 ``cpu.max`` allows ("150000 100000" -> 1.5), None for "max" or no file."""
    try:
        with open(path) as f:
            q, _, p = f.read().strip().partition(" ")
        if q != "max" and int(q) > 0:
            return int(q) / int(p or 100000)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    return None


def workers(value: Any, where: str) -> int:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return cpu_quota()
    return integer(1, 'a positive integer or "auto"')(value, where)


def bind_address(value: Any, where: str) -> str:
    """--bind: checked with the parser the monitor binds with (refork.addresses); kept as text. A
    host alone is port 8000 and a `tcp://` prefix is dropped, as gunicorn reads them."""
    text = string(value, where).strip()
    if text.startswith("tcp://"):
        text = text[len("tcp://") :]
    if re.fullmatch(r"[\w.-]+|\[[0-9a-fA-F:.]+\]", text):
        text += ":8000"
    return _address(text, where)


def _address(text: str, where: str) -> str:
    try:
        parse_bind(text)
    except ValueError:
        raise ConfigError(f"{where}: {got(text)} is not a valid address; use {BIND_SYNTAX}") from None
    return text


def trusted_proxy(value: Any, where: str) -> str:
    """Checked with the parser the HTTP layer trusts proxies with (refork.http.forwarded)."""
    text = string(value, where)
    try:
        parse_proxy(text)
    except ValueError:
        raise ConfigError(
            f"{where}: {got(text)} is not an address, a network like 10.0.0.0/8, 'unix:' or '*'"
        ) from None
    return text


def url_path(value: Any, where: str) -> str:
    text = string(value, where).strip()
    if text and not text.startswith("/"):
        raise ConfigError(f"{where} must start with '/', got {got(text)}")
    return text


def health_path(value: Any, where: str) -> str:
    """--health-path: a path of its own ("" = off); "/" would take the app's root."""
    text = url_path(value, where).rstrip("/")
    if not text and string(value, where).strip():
        raise ConfigError(f"{where} must be a path of its own like /_refork/health, not '/'")
    return text


def static_mount(value: Any, where: str) -> str:
    """--static: ``PREFIX=DIR`` with PREFIX a URL path of its own (not ``/``: the app's root)."""
    text = string(value, where).strip()
    prefix, eq, directory = text.partition("=")
    if not eq or not directory.strip() or not prefix.startswith("/") or not prefix.rstrip("/"):
        raise ConfigError(f"{where} must be PREFIX=DIRECTORY like /static=staticfiles, got {got(text)}")
    if any(ch in prefix for ch in "?#%\\ "):
        raise ConfigError(f"{where}: the URL prefix must be a plain path, got {got(prefix)}")
    return f"{prefix.rstrip('/')}={directory.strip()}"


def root_path(value: Any, where: str) -> str:
    return url_path(value, where).rstrip("/")


def refork_after(value: Any, where: str) -> list[int] | None:
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in ("off", "")):
        return None
    # A trailing "off" (False in a config file) stops reforking after the last count, as in Pitchfork;
    # it is kept as a final 0 (which reads back as the same).
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else value
    stop = isinstance(items, list | tuple) and len(items) > 1 and (
        items[-1] is False or items[-1] == 0 or (isinstance(items[-1], str) and items[-1].lower() == "off")
    )
    if stop:
        items = list(items[:-1])
    try:
        counts = list_of(integer(1))(items, where) or None
    except ConfigError:
        raise ConfigError(
            f'{where} must be request counts like 500,1000,2000 (optionally ending in ",off") or "off", '
            f"got {got(value)}"
        ) from None
    return counts + [0] if counts and stop else counts


def auto_or_positive_int(value: Any, where: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    return integer(1, 'a positive integer or "auto"')(value, where)


def default_or_positive_seconds(value: Any, where: str) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "default")):
        return None
    seconds = _seconds(value)
    if seconds is None or not seconds > 0:
        raise ConfigError(f'{where} must be a number of seconds > 0 or "default", got {got(value)}')
    return seconds


def fork_integrations(value: Any, where: str) -> list[str]:
    """Names of built-in fork integrations: a list, "all" or "none"."""
    names = list_of(string)(value, where)
    lowered = [name.lower() for name in names]
    if lowered == ["all"]:
        return list(NAMES)
    if lowered in (["none"], []):
        return []
    unknown = [name for name in lowered if name not in NAMES]
    if unknown:
        raise ConfigError(f"{where} must be all, none or a list of {','.join(NAMES)}, got {got(unknown[0])}")
    return [name for name in NAMES if name in lowered]


def optional_bind_address(value: Any, where: str) -> str | None:
    """--metrics-bind: an address as --bind takes it, or off (None)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off")):
        return None
    return _address(string(value, where).strip(), where)


_PROXY_MODES = {
    "off": "off", "false": "off", "0": "off", "none": "off", "no": "off",
    "auto": "auto", "true": "auto", "1": "auto", "yes": "auto", "v1": "v1", "v2": "v2",
}  # fmt: skip


def proxy_protocol(value: Any, where: str) -> str:
    """--proxy-protocol: off, v1, v2 or auto; gunicorn's spellings too (a bool, None, true/false)."""
    if value is None or isinstance(value, bool):
        return "auto" if value else "off"
    if isinstance(value, str) and value.strip().lower() in _PROXY_MODES:
        return _PROXY_MODES[value.strip().lower()]
    raise ConfigError(f"{where} must be one of off|v1|v2|auto, got {got(value)}")


def statsd_address(value: Any, where: str) -> str | None:
    """--statsd-host: a StatsD server's address (refork.addresses.parse_statsd), or off (None)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off")):
        return None
    text = string(value, where).strip()
    try:
        parse_statsd(text)
    except ValueError:
        raise ConfigError(f"{where}: {got(text)} is not a StatsD address; use {STATSD_SYNTAX}") from None
    return text


def statsd_tags(value: Any, where: str) -> str:
    """--dogstatsd-tags: comma-separated tags, ASCII, nothing that would end a StatsD line."""
    text = string(value, where).strip()
    if text and (not text.isascii() or any(c in text for c in "|#\n\r") or not all(text.split(","))):
        raise ConfigError(f"{where} must be comma-separated ASCII tags like env:prod,team:web, "
                          f"got {got(text)}")  # fmt: skip
    return text


def histogram_buckets(value: Any, where: str) -> list[float]:
    """--metrics-buckets: ascending, finite, positive upper bounds, at most 39 (the slot's room)."""
    bounds = list_of(non_negative_float)(value, where)
    if not bounds or len(bounds) > 39:
        raise ConfigError(f"{where} must be 1 to 39 bucket bounds like 0.01,0.1,1, got {got(value)}")
    if any(not math.isfinite(b) or b <= 0 for b in bounds) or bounds != sorted(set(bounds)):
        raise ConfigError(f"{where} must be positive seconds in ascending order, got {got(value)}")
    return bounds


_CERT_REQS = {"none": 0, "optional": 1, "required": 2}


def cert_reqs(value: Any, where: str) -> int:
    """gunicorn's --cert-reqs: 0/1/2 (ssl.CERT_NONE/OPTIONAL/REQUIRED) or none/optional/required."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2):
        return value
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("cert_")
        if text in ("0", "1", "2"):
            return int(text)
        if text in _CERT_REQS:
            return _CERT_REQS[text]
    raise ConfigError(f"{where} must be 0|1|2 or none|optional|required, got {got(value)}")


"""gunicorn's worker classes refork maps, by the names gunicorn takes, to how refork serves them."""


def timeout_seconds(value: Any, where: str) -> float:
    """--timeout: seconds > 0, or 0 (also "off"): no timeout, as in gunicorn."""
    if isinstance(value, str) and value.strip().lower() == "off":
        return 0.0
    seconds = _seconds(value)
    if seconds is None or seconds < 0:
        raise ConfigError(f'{where} must be a number of seconds (0 or "off": none), got {got(value)}')
    return seconds


def non_negative_seconds(value: Any, where: str) -> float:
    """Seconds >= 0 (gunicorn's graceful_timeout and keepalive take 0)."""
    seconds = _seconds(value)
    if seconds is None or seconds < 0:
        raise ConfigError(f"{where} must be a number of seconds >= 0, got {got(value)}")
    return seconds


def limit(zero: int, most: int | None = None) -> Coercer[int]:
    """gunicorn's request limits: a positive count, where 0 means `zero` (its no-limit value) and
    values above `most` are `most` (gunicorn's cap)."""

    def coerce(value: Any, where: str) -> int:
        number = integer(0, "an integer >= 0 (0: no limit)")(value, where)
        if number == 0:
            return zero
        return min(number, most) if most else number

    return coerce


def proc_name(value: Any, where: str) -> str:
    """-n/--name: None (gunicorn's "not set") is the default name."""
    if value is None:
        return "refork"
    return nonempty_string(value, where)


HTTP_PROTOCOLS = ("h1", "h2", "h2c")


def http_protocols(value: Any, where: str) -> list[str]:
    """gunicorn's --http-protocols: h1, h2, h2c as a comma list (or a list), in preference order."""
    if isinstance(value, str):
        parts = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        parts = [p for v in value for p in v.split(",")]
    else:
        raise ConfigError(f"{where} must be a comma list of h1, h2, h2c, got {got(value)}")
    protocols = [p.strip().lower() for p in parts if p.strip()]
    for name in protocols:
        if name not in HTTP_PROTOCOLS:
            raise ConfigError(f"{where}: unknown protocol {name!r} (h1, h2 or h2c, e.g. h2,h1)")
    if not protocols:
        raise ConfigError(f"{where} must name at least one of h1, h2, h2c")
    if len(set(protocols)) != len(protocols):
        raise ConfigError(f"{where} names a protocol twice: {','.join(protocols)}")
    return protocols


def http2_window(value: Any, where: str) -> int:
    """An HTTP/2 flow-control window: 65535 (the protocol's initial one) to 2^31-1 (RFC 9113 6.9)."""
    number = integer(65535, "an integer from 65535 to 2147483647")(value, where)
    if number > 2**31 - 1:
        raise ConfigError(f"{where} must be at most 2147483647, got {number}")
    return number


def http2_frame_size(value: Any, where: str) -> int:
    """SETTINGS_MAX_FRAME_SIZE: 16384 to 16777215 (RFC 9113 6.5.2)."""
    number = integer(16384, "an integer from 16384 to 16777215")(value, where)
    if number > 16777215:
        raise ConfigError(f"{where} must be at most 16777215, got {number}")
    return number
