"""TLS: the server context, which the monitor builds and checks and every loop is given.

The context is built by the monitor when it checks the files (:func:`check`, at start and on each
HUP): a bad path, a key that does not match the certificate or a wrong password is one line and
exit 2 at start, and a logged error that keeps the running generation on HUP. The context that
passed the check is the one served: molds and workers inherit it through fork (an ``SSLContext``
with no connection in it; OpenSSL reseeds its random generator in a forked child), so the files
are read once per generation, with no window between the check and the use, and never per
connection. Nothing of OpenSSL with a connection in it ever crosses a fork. A process that finds
no inherited context for its settings (not started by the monitor) builds its own.

TLS applies to every TCP listener; a unix-socket listener stays plain (a local proxy talks to it).
The WSGI loop drives each connection's handshake and I/O itself (:mod:`refork.serving.tls_io`);
the ASGI loop hands the context to asyncio / uvloop (``create_server(ssl=...,
ssl_handshake_timeout=...)``).
"""

from __future__ import annotations

import logging
import re
import socket
import ssl
from collections.abc import Iterable
from typing import Any

from refork import hooks
from refork.config import Config
from refork.errors import ConfigError

log = logging.getLogger("refork")

# TLS settings -> the context the monitor built and checked for them (the newest, after a HUP)
_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}


def _settings(config: Config) -> tuple[Any, ...]:
    return (config.certfile, config.keyfile, config.keyfile_password, config.ca_certs, config.cert_reqs,
            config.ciphers)  # fmt: skip


def is_tls_listener(sock: socket.socket) -> bool:
    """TLS goes on TCP listeners; a unix socket stays plain."""
    return sock.family in (socket.AF_INET, socket.AF_INET6)


def server_context(config: Config) -> ssl.SSLContext | None:
    """The server-side context the settings describe (None without --certfile); OSError / SSLError
    on bad files (see :func:`check` for the readable form). A config file's ssl_context(config,
    default_ssl_context_factory) hook gets to make it, as in gunicorn."""
    if not config.certfile:
        return None
    if "ssl_context" in config.hooks:
        cfg, factory = hooks.GunicornConfig(config), lambda: _default_context(config)
        made = hooks.call(config, "ssl_context", cfg, factory)
        if not isinstance(made, ssl.SSLContext):
            what = type(made).__name__
            raise ConfigError(f"the ssl_context hook must return an ssl.SSLContext, got {what}")
        return made
    return _default_context(config)


def _default_context(config: Config) -> ssl.SSLContext:
    assert config.certfile is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_SINGLE_ECDH_USE
    ctx.options |= getattr(ssl, "OP_NO_RENEGOTIATION", 0)  # a write never needs a read after the handshake
    password = config.keyfile_password
    # a callable, not None: OpenSSL would otherwise ask for an encrypted key's password on the tty
    ctx.load_cert_chain(config.certfile, config.keyfile, lambda: password or "")
    if config.ciphers:
        ctx.set_ciphers(config.ciphers)
    if config.ca_certs:
        ctx.load_verify_locations(config.ca_certs)
    ctx.verify_mode = ssl.VerifyMode(config.cert_reqs)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def check(config: Config) -> None:
    """Build the context once to check the files: ConfigError (one line) if it cannot be built."""
    if not config.certfile:
        for name in ("keyfile", "ca_certs", "ciphers"):
            if getattr(config, name):
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} is set but --certfile is not: TLS needs a certificate")
        return
    if config.cert_reqs != ssl.CERT_NONE and not config.ca_certs:
        raise ConfigError("--cert-reqs optional/required needs --ca-certs (the CAs client certificates "
                          "must chain to)")  # fmt: skip
    for flag, path in (("--certfile", config.certfile), ("--keyfile", config.keyfile),
                       ("--ca-certs", config.ca_certs)):  # fmt: skip
        if path:
            try:
                with open(path, "rb"):
                    pass
            except OSError as e:
                raise ConfigError(f"TLS: {flag} {path}: {e.strerror or e}") from None
    try:
        ctx = server_context(config)
    except ssl.SSLError as e:
        text = str(e.args[-1] if e.args and isinstance(e.args[-1], str) else e)
        reason = re.sub(r"^\[[\w: ]+\]\s*|\s*\(_ssl\.c:\d+\)$", "", text)
        raise ConfigError(f"TLS: {_what_failed(e, config)}: {reason}") from None
    except OSError as e:
        name = e.filename or config.certfile
        raise ConfigError(f"TLS: cannot read {name}: {e.strerror or e}") from None
    if ctx is not None:
        _CONTEXTS[_settings(config)] = ctx  # what the next mold and its workers serve


def _what_failed(e: ssl.SSLError, config: Config) -> str:
    text = str(e).lower()
    key = config.keyfile or config.certfile
    if "mismatch" in text:
        return f"the key in {key} does not match the certificate {config.certfile}"
    if "cipher" in text:
        return f"--ciphers {config.ciphers!r}"
    if "decrypt" in text or "bad password" in text or "pem lib" in text:
        return f"cannot load the private key from {key} (none in it, or a wrong --keyfile-password?)"
    return f"cannot load {config.certfile}" + (f" / {config.ca_certs}" if config.ca_certs else "")


def contexts_for(listeners: Iterable[socket.socket], config: Config) -> dict[int, ssl.SSLContext]:
    """listener fd -> the context its connections use (TCP listeners only; one context for all).

    The context the monitor checked, inherited; built here only when there is none (then a file
    that does not load ends this process with one logged line)."""
    if not config.certfile:
        return {}
    ctx = _CONTEXTS.get(_settings(config))
    if ctx is None:
        try:
            check(config)
        except ConfigError as e:
            log.error("%s; exiting", e)
            raise SystemExit(1) from None
        ctx = _CONTEXTS[_settings(config)]
    return {sock.fileno(): ctx for sock in listeners if is_tls_listener(sock)}
