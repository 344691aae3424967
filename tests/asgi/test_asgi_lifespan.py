"""ASGI lifespan: startup, shutdown and the state they hand to requests, unit and over a real
socket; an app without lifespan still serves, a failed startup ends the worker.
"""

from __future__ import annotations

import json

import pytest
from support.asgi_server import exchange

# ---------------------------------------------------------------------------------------------
# Unit: lifespan


def _run_lifespan(app):
    import asyncio

    from refork.asgi import Lifespan

    async def main():
        lifespan = Lifespan(app)
        await lifespan.startup()
        await lifespan.shutdown()
        return lifespan

    return asyncio.run(main())


def test_lifespan_complete_and_state():
    from apps import asgi_apps

    lifespan = _run_lifespan(asgi_apps.app)
    assert lifespan.supported and lifespan.state == {"started": "yes"}


def test_lifespan_unsupported_app():
    from apps import asgi_apps

    assert not _run_lifespan(asgi_apps.no_lifespan).supported
    assert not _run_lifespan(asgi_apps.hello).supported


def test_lifespan_failures_raise():
    from apps import asgi_apps

    from refork.asgi import LifespanFailure

    with pytest.raises(LifespanFailure, match="database unreachable"):
        _run_lifespan(asgi_apps.failing_startup)

    async def raises_in_startup(scope, receive, send):
        await receive()
        raise OSError("no disk")

    with pytest.raises(LifespanFailure, match="no disk"):
        _run_lifespan(raises_in_startup)


# ---------------------------------------------------------------------------------------------
# Real sockets (the server: tests/support/asgi_server.py)


def test_lifespan_startup_state_and_shutdown(serve, tmp_path):
    logfile = tmp_path / "lifespan.log"
    proc = serve(env={"LIFESPAN_LOG": str(logfile)})
    status, _, body = exchange(proc, b"GET /scope HTTP/1.1\r\nHost: a\r\n\r\n")
    assert logfile.read_text() == "startup\n"  # startup ran before the first request was served
    assert json.loads(body)["state"] == {"started": "yes"}
    code, out, err = proc.finish()
    assert code == 0, err
    assert logfile.read_text() == "startup\nshutdown\n"


def test_app_without_lifespan_still_serves(serve):
    proc = serve("apps.asgi_apps:no_lifespan")
    assert exchange(proc, b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")[2] == b"no lifespan here"
    code, out, err = proc.finish()
    assert code == 0 and "Traceback" not in err


def test_lifespan_startup_failure_exits(serve):
    proc = serve("apps.asgi_apps:failing_startup")
    code, out, err = proc.finish(sig=0)  # it exits by itself
    assert code != 0
    assert "database unreachable" in err and "worker exiting" in err
