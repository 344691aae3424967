"""The WSGI environ of one request: CGI names for the headers, host and port, forwarded peers.

A per-worker base dict is copied, not rebuilt, per request; header names and hosts seen before
come from small caches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

from refork.http.body import InputStream
from refork.http.events import Request
from refork.http.forwarded import TrustedProxies, resolve_forwarded
from refork.wsgi.files import FileWrapper

log = logging.getLogger("refork")


_PLAIN, _HOST, _FORWARDED = 0, 1, 2
_HEADER_INFO: dict[bytes, tuple[str | None, int]] = {
    b"content-type": ("CONTENT_TYPE", _PLAIN),
    b"content-length": ("CONTENT_LENGTH", _PLAIN),
    b"host": ("HTTP_HOST", _HOST),
}


def _header_info(name: bytes) -> tuple[str | None, int]:
    """(CGI name, kind) for a header; a None name drops it: with underscores it would alias a
    dashed name (X_Forwarded_For vs X-Forwarded-For), a spoofing vector."""
    if b"_" in name:
        info: tuple[str | None, int] = (None, _PLAIN)
    else:
        key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
        info = (key, _FORWARDED if name.startswith(b"x-forwarded-") else _PLAIN)
    if len(_HEADER_INFO) < 512:
        _HEADER_INFO[name] = info
    return info


_PROTOCOLS = {"1.1": "HTTP/1.1", "1.0": "HTTP/1.0"}


def _split_host(host: str, default_port: str) -> tuple[str, str]:
    if host.startswith("["):
        end = host.find("]")
        if end > 0:
            rest = host[end + 1 :]
            return host[1:end], (rest[1:] if rest.startswith(":") and rest[1:] else default_port)
    name, sep, port = host.rpartition(":")
    if sep and port.isdigit():
        return name, port
    return host, default_port


class ErrorStream:
    """``wsgi.errors``: a text stream that goes to the "refork" error log, not a bare stderr."""

    def write(self, s: str) -> int:
        text = s.rstrip("\n")
        if text:
            log.error("%s", text)
        return len(s)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass


class EnvironBuilder:
    """Builds environs from a per-worker base dict that is copied, not rebuilt, per request."""

    def __init__(
        self,
        *,
        server: tuple[str, int] | str,
        url_scheme: str = "http",
        root_path: str = "",
        errors: Any = None,
        multithread: bool = False,
        multiprocess: bool = True,
        proxies: TrustedProxies | None = None,
        file_wrapper: Any = None,
    ) -> None:
        self.url_scheme = url_scheme
        self.root_path = root_path.rstrip("/")
        self.proxies = proxies if proxies is not None else TrustedProxies([])
        # secure_scheme_headers named other than X-Forwarded-* (gunicorn allows any name): a
        # request carrying one goes through the trusted-proxy rules too
        self.other_secure_headers = frozenset(
            name for name in self.proxies.secure_headers if not name.startswith(b"x-forwarded-")
        )
        if isinstance(server, tuple):
            self.server_name, self.server_port = str(server[0]), str(server[1])
        else:  # unix socket: no meaningful address
            self.server_name, self.server_port = "localhost", ""
        self._hosts: dict[tuple[bytes, str], tuple[str, str]] = {}
        self.base: dict[str, Any] = {
            "SCRIPT_NAME": self.root_path,
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": url_scheme,
            "wsgi.errors": errors if errors is not None else ErrorStream(),
            "wsgi.multithread": multithread,
            "wsgi.multiprocess": multiprocess,
            "wsgi.run_once": False,
            "wsgi.file_wrapper": file_wrapper if file_wrapper is not None else FileWrapper,
            "wsgi.input_terminated": True,
            "SERVER_SOFTWARE": "refork",
            "REMOTE_ADDR": "",  # a unix-socket peer's, as gunicorn's: a TCP peer's replaces it
        }

    def _server(self, host: bytes | None, scheme: str) -> tuple[str, str]:
        default_port = "443" if scheme in ("https", "wss") else "80"
        if host is None:
            return self.server_name, self.server_port or default_port
        key = (host, scheme)
        hit = self._hosts.get(key)
        if hit is None:
            hit = _split_host(host.decode("latin-1"), default_port)
            if len(self._hosts) < 256:
                self._hosts[key] = hit
        return hit

    def build(self, request: Request, body: InputStream, client: tuple[str, int] | None) -> dict[str, Any]:
        env = self.base.copy()
        env["REQUEST_METHOD"] = request.method
        raw = request.path  # the parser has reduced an absolute-form target to its path
        path = unquote_to_bytes(raw).decode("latin-1") if b"%" in raw else raw.decode("latin-1")
        root = self.root_path
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :]
        env["PATH_INFO"] = path
        env["QUERY_STRING"] = request.query.decode("latin-1")
        env["RAW_URI"] = env["REQUEST_URI"] = request.target.decode("latin-1")
        env["SERVER_PROTOCOL"] = _PROTOCOLS.get(request.http_version) or "HTTP/" + request.http_version
        host = None
        forwarded = False
        for name, value in request.headers:
            info = _HEADER_INFO.get(name)
            if info is None:
                info = _header_info(name)
            key, kind = info
            if key is None:
                continue
            if key in env:  # a repeated field: join (cookies with "; ", RFC 6265)
                sep = "; " if key == "HTTP_COOKIE" else ","
                env[key] = env[key] + sep + value.decode("latin-1")
            else:
                env[key] = value.decode("latin-1")
            if kind:
                if kind == _HOST:
                    host = value
                else:
                    forwarded = True
        if not forwarded and self.other_secure_headers:
            forwarded = any(name in self.other_secure_headers for name, _ in request.headers)
        if request.content_length is not None or request.chunked:
            env["CONTENT_LENGTH"] = str(body.length)
        env["wsgi.input"] = body
        if client is not None:
            env["REMOTE_ADDR"] = client[0]
            env["REMOTE_PORT"] = str(client[1])
        scheme = self._forwarded(env, request.headers, client) if forwarded else self.url_scheme
        if scheme != self.url_scheme:
            env["wsgi.url_scheme"] = scheme
        env["SERVER_NAME"], env["SERVER_PORT"] = self._server(host, scheme)
        return env

    def _forwarded(self, env: dict[str, Any], headers: list[tuple[bytes, bytes]],
                   client: tuple[str, int] | None) -> str:  # fmt: skip
        """A trusted proxy's X-Forwarded-For in REMOTE_ADDR; the scheme its X-Forwarded-Proto says."""
        if client is not None:
            peer = client[0]
            scheme, addr = resolve_forwarded(headers, peer, self.url_scheme, self.proxies)
            if addr != peer and addr is not None:
                env["REMOTE_ADDR"] = addr
                del env["REMOTE_PORT"]
        else:  # a unix-socket peer: trusted only as --forwarded-allow-ips says (`unix:`)
            scheme, addr = resolve_forwarded(headers, None, self.url_scheme, self.proxies)
            if addr is not None:
                env["REMOTE_ADDR"] = addr
        return scheme

    def apply_forwarded(self, env: dict[str, Any], headers: list[tuple[bytes, bytes]],
                        client: tuple[str, int] | None) -> None:  # fmt: skip
        """The X-Forwarded-* rules on an environ refork._native built with those fields as plain
        HTTP_ keys: as build() would have made it (REMOTE_ADDR, the scheme, SERVER_NAME/PORT)."""
        scheme = self._forwarded(env, headers, client)
        if scheme != self.url_scheme:
            env["wsgi.url_scheme"] = scheme
            host = env.get("HTTP_HOST")
            env["SERVER_NAME"], env["SERVER_PORT"] = self._server(
                host.encode("latin-1") if host is not None else None, scheme
            )
