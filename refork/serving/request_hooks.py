"""gunicorn's per-request hooks: ``pre_request(worker, req)`` and ``post_request(worker, req, environ,
resp)``, with gunicorn's argument shapes, on every request path; built only when the config file
has one of them (a request path without them pays one ``is None`` test).

``req`` (:class:`HookRequest`) is gunicorn's Request as hooks read it: ``method``, ``uri``, ``path``,
``query``, ``fragment``, ``version`` (``(1, 1)``), ``headers`` (``[(NAME, value)]``, names
upper-cased), ``scheme``, ``remote_addr`` / ``peer_addr`` (``(host, port)``), ``body`` (WSGI: the
request's input stream), ``should_close()``. The same object reaches post_request (a hook may
keep what it measured on it); on the WSGI paths it rides in the environ (``refork.request``).
``resp`` (:class:`HookResponse`): ``status`` (``"200 OK"``), ``status_code``, ``headers`` (the app's
``[(name, value)]``), ``response_length`` (its Content-Length, or None) and ``sent`` (body bytes
written). pre_request runs before the app; if it raises, the request is answered as if the app
had raised (500). post_request runs once the response is done; if it raises, the exception is
logged ("Exception in post_request hook") and serving goes on.

On the WSGI paths post_request runs where the access-log line is written: :class:`Finisher` stands
in for the access log (the native engines write it from Rust with the environ and the app's
headers), and writes the line too when there is one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

from refork import hooks
from refork.config import Config
from refork.http.events import Request
from refork.log_format import asgi_environ
from refork.logs import AccessLog

log = logging.getLogger("refork")

ENVIRON_KEY = "refork.request"  # the HookRequest of a WSGI request, from pre_request to post_request


def _reason(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


class HookRequest:
    """gunicorn's ``req`` (see the module docs)."""

    def __init__(
        self, request: Request, scheme: str, client: Any, body: Any = None, asgi: bool = False
    ) -> None:
        self.method = request.method
        self.uri = request.target.decode("latin-1")
        if asgi:  # gunicorn's ASGI worker: the path as ASGI decodes it
            self.path = unquote_to_bytes(request.path).decode("utf-8", "replace")
        else:
            self.path = request.path.decode("latin-1")
        self.query = request.query.decode("latin-1")
        self.fragment = ""
        major, _, minor = request.http_version.partition(".")
        self.version = (int(major), int(minor or 0))
        self.headers = [(n.decode("latin-1").upper(), v.decode("latin-1")) for n, v in request.headers]
        self.trailers: list[tuple[str, str]] = []
        self.scheme = scheme
        self.remote_addr = self.peer_addr = client
        self.body = body
        self.proxy_protocol_info = None
        self._keep_alive = request.keep_alive

    def should_close(self) -> bool:
        return not self._keep_alive

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.uri}>"


class HookResponse:
    """gunicorn's ``resp`` (see the module docs)."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]] | None, sent: int) -> None:
        self.status_code = status
        self.status = _reason(status)
        self.headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in headers or ()]
        self.response_length: int | None = None
        for name, value in self.headers:
            if name.lower() == "content-length" and value.isdigit():
                self.response_length = int(value)
        self.sent = sent
        self.headers_sent = True

    def __repr__(self) -> str:
        return f"<Response {self.status}>"


def _raising(exc: BaseException, asgi: bool) -> Callable[..., Any]:
    """An app that raises what pre_request raised: the request's answer is the app error's."""
    if asgi:

        async def failed_asgi(scope: Any, receive: Any, send: Any) -> None:
            raise exc

        return failed_asgi

    def failed(environ: Any, start_response: Any) -> Any:
        raise exc

    return failed


class RequestHooks:
    """pre_request and post_request of one worker (see the module docs)."""

    def __init__(self, pre: Callable[..., Any] | None, post: Callable[..., Any] | None, worker: Any) -> None:
        self.pre = pre
        self.post = post
        self.worker = worker

    @classmethod
    def from_config(cls, config: Config) -> RequestHooks | None:
        pre, post = config.hooks.get("pre_request"), config.hooks.get("post_request")
        if pre is None and post is None:
            return None
        return cls(pre, post, hooks.this_worker())

    # -- WSGI ------------------------------------------------------------------------------------

    def before_wsgi(self, request: Request, environ: dict[str, Any]) -> None:
        """Make the request's ``req`` (kept in the environ) and run pre_request (its error raises)."""
        address = environ.get("REMOTE_ADDR")
        client = (address, int(environ.get("REMOTE_PORT") or 0)) if address else None
        req = environ[ENVIRON_KEY] = HookRequest(request, environ.get("wsgi.url_scheme", "http"), client,
                                                 environ.get("wsgi.input"))  # fmt: skip
        if self.pre is not None:
            self.pre(self.worker, req)

    def wrap_wsgi(
        self, app: Callable[..., Any], request: Request, environ: dict[str, Any]
    ) -> Callable[..., Any]:
        """The app to call for this request: `app`, or one that raises what pre_request raised."""
        try:
            self.before_wsgi(request, environ)
        except Exception as exc:
            return _raising(exc, False)
        return app

    def after_wsgi(self, environ: dict[str, Any] | None, status: int, length: int,
                   headers: list[tuple[bytes, bytes]] | None) -> None:  # fmt: skip
        if self.post is None or environ is None:
            return
        req = environ.get(ENVIRON_KEY)
        if req is not None:
            self._post(req, environ, HookResponse(status, headers, length))

    # -- ASGI ------------------------------------------------------------------------------------

    def before_asgi(self, request: Request, client: Any, scheme: str) -> tuple[HookRequest, Any]:
        """The request's ``req``, and None or what pre_request raised (the app then is not called)."""
        req = HookRequest(request, scheme, client, asgi=True)
        if self.pre is not None:
            try:
                self.pre(self.worker, req)
            except Exception as exc:
                return req, _raising(exc, True)
        return req, None

    def after_asgi(self, req: HookRequest | None, request: Request, remote: str | None, status: int,
                   length: int, headers: list[tuple[bytes, bytes]] | None) -> None:  # fmt: skip
        if self.post is None or req is None:
            return
        environ = asgi_environ(request, remote)  # gunicorn's ASGI worker's environ
        self._post(req, environ, HookResponse(status, headers, 0 if request.method == "HEAD" else length))

    def _post(self, req: HookRequest, environ: dict[str, Any], resp: HookResponse) -> None:
        assert self.post is not None
        try:
            self.post(self.worker, req, environ, resp)
        except Exception:
            log.exception("Exception in post_request hook")


class Finisher:
    """The access log's stand-in on the WSGI paths when post_request is set: the line (if the access
    log is on), then the hook, where every WSGI path ends a request (refork.serving.connection
    .log_access)."""

    def __init__(self, access_log: AccessLog | None, hooks: RequestHooks) -> None:
        self.access_log = access_log
        self.hooks = hooks

    def write(self, request: Request, remote: str | None, status: int, length: int, duration: float,
              environ: dict[str, Any] | None = None,
              response_headers: list[tuple[bytes, bytes]] | None = None) -> None:  # fmt: skip
        if self.access_log is not None:
            try:
                self.access_log.write(request, remote, status, length, duration, environ, response_headers)
            except Exception:
                log.exception("access log failed")
        self.hooks.after_wsgi(environ, status, length, response_headers)


def request_end(config: Config, request_hooks: RequestHooks | None) -> AccessLog | Finisher | None:
    """What a WSGI path calls when a response is done: the access log, or a Finisher with it."""
    access_log = AccessLog.from_config(config)
    if request_hooks is not None and request_hooks.post is not None:
        return Finisher(access_log, request_hooks)
    return access_log
