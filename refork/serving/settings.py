"""What a worker serves with, derived from the Config once (:class:`ServingSettings`).

serve() builds it when the worker starts serving and hands the one object to the loop it runs;
an engine host hands the same object to its Rust engine, which reads its fields once (limits,
timeouts, health paths, the PROXY policy, the inline-body threshold, the accept batch and the
read size) instead of keeping copies of Python's constants. The loops still read the Config for
what only one of them uses (WebSocket limits, the event-loop flavour, the spool's directory).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from refork.config import Config
from refork.http.forwarded import TrustedProxies
from refork.http.parser import Limits
from refork.http.proxy_protocol import ProxyPolicy, policy
from refork.logs import AccessLog
from refork.serving.connection import RequestEnd, Timeouts, request_limits
from refork.serving.health import HealthPaths, health_paths
from refork.serving.request_hooks import RequestHooks, request_end
from refork.serving.tls_context import contexts_for

# accepts per wake-up of a loop or an engine: more would starve sibling workers sharing the listener
ACCEPT_BATCH = 8
READ_SIZE = 1 << 16  # bytes asked of one recv() on a client connection


@dataclass(frozen=True)
class ServingSettings:
    """The serving side of the Config for one worker, built once (:meth:`for_worker`)."""

    limits: Limits  # the parser's (--limit-request-*)
    timeouts: Timeouts  # the connection contract's deadlines (refork.serving.connection)
    request_hooks: RequestHooks | None  # gunicorn's pre_request / post_request, if any
    access_log: AccessLog | None  # the access log in this interface's format; None: off
    request_end: RequestEnd | None  # what a WSGI response's end calls: the log, or a Finisher with it
    health: HealthPaths | None  # --health-path
    tls: Mapping[int, ssl.SSLContext]  # listener fd -> its TLS context (the TLS listeners)
    handshake_timeout: float  # --ssl-handshake-timeout
    forwarded: TrustedProxies  # who may send X-Forwarded-* (--forwarded-allow-ips), and the scheme headers
    forwarded_allowed: bool  # --forwarded-allow-ips names any peer at all
    proxy: ProxyPolicy | None  # the PROXY protocol (--proxy-protocol), None: off
    inline_body: int  # a request body up to this many bytes is held in memory (--body-spool-threshold)
    max_request_memory: int  # the worker's budget of request bytes held in memory
    root_path: str
    threads: int  # app threads (WSGI; at least 1)
    h1: bool = True  # --http-protocols: HTTP/1.1 served
    h2c: bool = False  # --http-protocols: HTTP/2 on cleartext listeners (prior knowledge)
    accept_batch: int = ACCEPT_BATCH
    read_size: int = READ_SIZE

    @classmethod
    def for_worker(cls, config: Config, listeners: list[socket.socket], asgi: bool = False
                   ) -> ServingSettings:  # fmt: skip
        """The settings of a worker serving `listeners` (the TLS contexts are the monitor's,
        inherited; see refork.serving.tls_context)."""
        hooks = RequestHooks.from_config(config)
        allow = config.forwarded_allow_ips
        return cls(
            limits=request_limits(config),
            timeouts=Timeouts.from_config(config),
            request_hooks=hooks,
            access_log=AccessLog.from_config(config, asgi=True) if asgi else None,
            request_end=None if asgi else request_end(config, hooks),
            health=health_paths(config.health_path),
            tls=contexts_for(listeners, config),
            handshake_timeout=config.ssl_handshake_timeout,
            forwarded=TrustedProxies(
                allow, config.secure_scheme_headers, client=config.forwarded_client != "off"
            ),
            forwarded_allowed=bool(allow),
            proxy=policy(config.proxy_protocol, config.proxy_allow_ips),
            inline_body=config.body_spool_threshold,
            max_request_memory=config.max_request_memory,
            root_path=config.root_path,
            threads=max(1, int(config.threads)),
            h1="h1" in config.http_protocols,
            h2c="h2c" in config.http_protocols,
        )
