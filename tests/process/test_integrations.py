"""Built-in fork integrations, in this process, against real libraries and local servers.

Each test makes the library hold a live pooled connection, runs the mold's step (before_fork) or
the worker's (after_fork), and checks from the pool and from the server side what is left.
"""

from __future__ import annotations

import http.server
import logging
import os
import socket
import sys
import threading

import pytest
from support.fake_redis import FakeRedis

from refork import integrations

# forks while a test server thread runs: Python 3.12+ warns, on purpose here
pytestmark = pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")


@pytest.fixture(autouse=True)
def fresh_integrations():
    yield
    integrations._active = integrations.Active([])


@pytest.fixture
def fake_redis():
    server = FakeRedis()
    yield server
    server.close()


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peers: set[int] = set()

    def do_GET(self):
        _KeepAlive.peers.add(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    _KeepAlive.peers = set()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def wait_until(predicate, what):
    import time

    deadline = time.monotonic() + 5
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_the_log_line_names_the_active_integrations_and_those_switched_off(caplog):
    import numpy.random  # noqa: F401
    import redis  # noqa: F401
    import sqlalchemy  # noqa: F401

    with caplog.at_level(logging.INFO, logger="refork"):
        integrations.activate(["redis", "numpy"])
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("fork integrations"))
    assert line.startswith("fork integrations: redis, numpy (off: ")
    assert "sqlalchemy" in line.split("(off: ")[1] and line.endswith(": --fork-integrations)")


def test_nothing_is_imported_for_a_library_the_app_did_not_import():
    before = set(sys.modules)
    integrations.activate(list(integrations.NAMES))
    assert "pymongo" not in sys.modules and "grpc" not in sys.modules
    assert {m for m in set(sys.modules) - before if not m.startswith("refork")} == set()


def test_sqlalchemy_pools_are_closed_in_the_mold_and_fresh_in_a_worker(tmp_path):
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}", poolclass=sqlalchemy.QueuePool)
    with engine.connect() as conn:
        conn.execute(sqlalchemy.text("select 1"))
    assert engine.pool.checkedin() == 1
    integrations.activate(["sqlalchemy"])
    integrations.before_fork()
    assert engine.pool.checkedin() == 0
    with engine.connect() as conn:  # the mold's engine still works (the app's before_fork hooks)
        conn.execute(sqlalchemy.text("select 1"))
    old_pool = engine.pool
    integrations.after_fork()
    assert engine.pool is not old_pool and engine.pool.checkedin() == 0
    assert old_pool.checkedin() == 1  # dispose(close=False): the parent's connection untouched


def test_sqlalchemy_async_engines_are_found_through_sync_engine(tmp_path):
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    integrations.activate(["sqlalchemy"])
    old_pool = engine.sync_engine.pool
    integrations.after_fork()
    assert engine.sync_engine.pool is not old_pool


def test_redis_pools_disconnect_before_a_fork_and_reconnect_on_their_own(fake_redis):
    import redis

    client = redis.Redis(host="127.0.0.1", port=fake_redis.port)
    first = client.client_id()
    integrations.activate(["redis"])
    integrations.before_fork()
    wait_until(lambda: first not in fake_redis.open, "the mold's connection closed on the server side")
    assert client.client_id() != first  # a new connection, made lazily


def test_redis_asyncio_pools_disconnect_in_the_mold(fake_redis):
    import asyncio

    import redis.asyncio

    client = redis.asyncio.Redis(host="127.0.0.1", port=fake_redis.port)

    async def connect():
        return await client.client_id()

    first = asyncio.run(connect())
    integrations.activate(["redis"])
    integrations.before_fork()
    assert client.connection_pool._available_connections == []
    wait_until(lambda: first not in fake_redis.open, "closed on the server side")


def test_redis_reset_in_the_child_leaves_the_parents_connection_alone(fake_redis):
    import redis

    client = redis.Redis(host="127.0.0.1", port=fake_redis.port)
    first = client.client_id()
    integrations.activate(["redis"])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            integrations.after_fork()
            os.write(write, str(client.client_id()).encode())
        finally:
            os._exit(0)
    os.close(write)
    child_id = int(os.read(read, 100))
    os.waitpid(pid, 0)
    assert child_id != first and client.client_id() == first  # each process its own connection
    assert first in fake_redis.open


def test_a_requests_session_drops_its_keep_alive_connections(http_server):
    import requests

    session = requests.Session()
    assert session.get(http_server).status_code == 200
    assert session.get(http_server).status_code == 200
    assert len(_KeepAlive.peers) == 1  # kept alive
    integrations.activate(["http"])
    integrations.before_fork()
    assert session.get(http_server).status_code == 200
    assert len(_KeepAlive.peers) == 2  # a new connection after the fork step


def test_an_httpx_client_drops_its_keep_alive_connections(http_server):
    import httpx

    client = httpx.Client()
    assert client.get(http_server).status_code == 200
    assert len(client._transport._pool.connections) == 1
    integrations.activate(["http"])
    integrations.after_fork()
    assert client._transport._pool.connections == []
    assert client.get(http_server).status_code == 200
    assert len(_KeepAlive.peers) == 2


def test_an_httpx_async_client_is_found_and_emptied(http_server):
    import asyncio

    import httpx

    client = httpx.AsyncClient()

    async def get():
        return (await client.get(http_server)).status_code

    assert asyncio.run(get()) == 200
    integrations.activate(["http"])
    integrations.before_fork()  # in the mold: its loop (the warm-up's) is gone; the peer sees it end
    assert client._transport._pool.connections == []
    wait_until(lambda: _closed_by_peer(_KeepAlive.peers), "the server saw the connection end")


def _closed_by_peer(ports):
    import subprocess

    established = subprocess.run(["ss", "-tn", "state", "established"], capture_output=True, text=True).stdout
    return not any(f":{port} " in established for port in ports)


def test_psycopg2_and_psycopg_connections_at_load_are_found(caplog):
    import psycopg
    import psycopg2.extensions  # noqa: F401

    integrations.activate(["psycopg"])
    kinds = integrations.active().integrations[0].resolve_classes()
    assert psycopg.Connection in kinds and psycopg2.extensions.connection in kinds


def test_numpy_legacy_generator_is_reseeded_in_the_child():
    import numpy

    numpy.random.seed(42)
    integrations.activate(["numpy"])
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            integrations.after_fork()
            os.write(write, str(numpy.random.randint(0, 2**31)).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = int(os.read(read, 100))
    os.waitpid(pid, 0)
    assert child != numpy.random.randint(0, 2**31)  # the parent's next draw


def test_grpc_fork_support_is_set_only_when_grpc_is_installed(monkeypatch):
    import importlib.util

    from refork.integrations import grpc

    monkeypatch.delenv("GRPC_ENABLE_FORK_SUPPORT", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert integrations.prepare_environment(["grpc"]) == []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    assert integrations.prepare_environment(["redis"]) == []
    assert integrations.prepare_environment(["grpc"]) == ["GRPC_ENABLE_FORK_SUPPORT=true"]
    assert os.environ["GRPC_ENABLE_FORK_SUPPORT"] == "true"
    assert grpc.prepare_environment() is None  # set already: left as the user set it


def test_known_unsafe_clients_get_a_warning_with_the_fix(monkeypatch, caplog):
    import types

    module = types.ModuleType("pymongo.mongo_client")

    class MongoClient:
        pass

    module.MongoClient = MongoClient
    monkeypatch.setitem(sys.modules, "pymongo", types.ModuleType("pymongo"))
    monkeypatch.setitem(sys.modules, "pymongo.mongo_client", module)
    client = MongoClient()
    with caplog.at_level(logging.WARNING, logger="refork"):
        integrations.activate(["unsafe"])
    assert any("a MongoClient exists at fork" in r.getMessage() and "per_process" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    del client


def test_a_failing_step_is_logged_and_does_not_stop_the_others(caplog):
    from refork.integrations.base import Integration

    def boom(objects):
        raise RuntimeError("boom")

    ran = []
    active = integrations.Active(
        [Integration("a", ("sys",), before_fork=boom), Integration("b", ("sys",), before_fork=ran.append)]
    )
    with caplog.at_level(logging.ERROR, logger="refork"):
        active.run("before_fork")
    assert ran == [[]] and "fork integrations: a before fork failed" in caplog.text


def test_the_heap_scan_finds_instances_of_subclasses_once(tmp_path):
    import sqlalchemy

    engine = sqlalchemy.create_engine("sqlite://")
    active = integrations.Active([i for i in integrations.ALL if i.name == "sqlalchemy"])
    active.scan()
    active.scan()
    assert [e for e in active.objects("sqlalchemy") if e is engine] == [engine]


def test_listeners_and_datagram_sockets_are_not_connections_to_cut():
    from refork.process.descriptors import needs_cleaning

    with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket(type=socket.SOCK_DGRAM) as dgram:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        try:
            def kind(s):
                return needs_cleaning(s.fileno(), os.readlink(f"/proc/self/fd/{s.fileno()}"))

            assert kind(listener) is None and kind(dgram) is None
            assert kind(client) == "socket" and kind(accepted) == "socket"
        finally:
            client.close()
            accepted.close()


def test_django_connections_close_before_a_fork_and_reopen_on_the_next_query(tmp_path):
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "db"),
                                   "CONN_MAX_AGE": None}},  # fmt: skip
            CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        )
        django.setup()
    from django.core.cache import cache
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("select 1")
    cache.set("k", 1)
    assert connection.connection is not None
    integrations.activate(["django"])
    integrations.before_fork()
    assert connection.connection is None
    with connection.cursor() as cursor:  # persistent connections: opened again, then kept
        cursor.execute("select 1")
    assert connection.connection is not None
    integrations.before_promotion()
    assert connection.connection is None


def test_a_psycopg_pool_is_closed_in_the_mold_and_opened_again_in_the_worker():
    import threading

    import psycopg_pool

    with socket.create_server(("127.0.0.1", 0)) as refusing:  # accepts, never speaks: no server needed
        port = refusing.getsockname()[1]
        pool = psycopg_pool.ConnectionPool(f"host=127.0.0.1 port={port} connect_timeout=1", min_size=1,
                                           open=True, name="refork-test")  # fmt: skip
        try:
            assert any(t.name.startswith("refork-test") for t in threading.enumerate())
            integrations.activate(["psycopg"])
            integrations.before_fork()
            assert pool.closed
            wait_until(lambda: not any(t.name.startswith("refork-test") for t in threading.enumerate()),
                       "the pool's threads stopped: nothing of it crosses the fork")  # fmt: skip
            integrations.after_fork()
            assert not pool.closed  # the worker's own pool, connecting in its own threads
            assert any(t.name.startswith("refork-test") for t in threading.enumerate())
        finally:
            pool.close(timeout=0)


def test_a_psycopg_pool_copied_from_a_worker_forgets_its_connections_and_reopens_in_the_new_worker():
    import psycopg_pool

    pool = psycopg_pool.ConnectionPool("host=127.0.0.1 port=1 connect_timeout=1", min_size=1, open=False)
    pool._closed, pool._opened = False, True  # as a worker's open pool looks in its promoted child
    sentinel = object()
    pool._pool.append(sentinel)  # one of the worker's idle connections
    integrations.activate(["psycopg"])
    try:
        integrations.after_promotion()  # in the promoted mold: forgotten, nothing started
        assert pool.closed and list(pool._pool) == [] and pool._workers == []
        from refork.integrations import psycopg

        assert sentinel in psycopg._forgotten
        integrations.after_fork()  # in its worker: the pool is opened, its own
        assert not pool.closed and pool._workers
    finally:
        pool.close(timeout=0)


@pytest.fixture
def fake_postgres():
    from support.fake_postgres import FakePostgres

    server = FakePostgres()
    yield server
    server.close()


def test_the_load_tracer_names_the_line_of_a_libpq_connection(fake_postgres):
    from refork.process import fork_check

    dsn = f"host=127.0.0.1 port={fake_postgres.port} user=u dbname=d connect_timeout=5"
    with fork_check.LoadTracer() as tracer:
        import psycopg
        import psycopg2

        old = psycopg2.connect(dsn)  # libpq connects from C: socket.connect never sees it
        new = psycopg.connect(dsn)
    try:
        assert psycopg2.connect.__name__ == "connect" and psycopg.connect.__name__ == "connect"  # restored
        hazards = {h.fd: h.origin for h in fork_check.open_connections(tracer=tracer)}
        here = f"{__file__}:"
        assert hazards[old.fileno()].startswith(here) and hazards[new.fileno()].startswith(here)
    finally:
        old.close()
        new.close()


def test_bare_psycopg_connections_made_at_load_are_closed_in_the_mold(fake_postgres, caplog):
    import psycopg
    import psycopg2

    dsn = f"host=127.0.0.1 port={fake_postgres.port} user=u dbname=d connect_timeout=5"
    old, new = psycopg2.connect(dsn), psycopg.connect(dsn)
    wait_until(lambda: fake_postgres.open == 2, "both connected")
    integrations.activate(["psycopg"])
    with caplog.at_level(logging.WARNING, logger="refork"):
        integrations.before_fork()
    assert old.closed and new.closed
    wait_until(lambda: fake_postgres.open == 0, "the server saw both end")
    assert caplog.text.count("closed a psycopg connection") == 1
    assert caplog.text.count("closed a psycopg2 connection") == 1


def test_a_grpc_channel_alive_at_fork_is_named(caplog):
    import grpc

    channel = grpc.insecure_channel("127.0.0.1:1")
    try:
        with caplog.at_level(logging.WARNING, logger="refork"):
            integrations.activate(["grpc"])
        assert "fork integrations: a gRPC channel" in caplog.text
        assert "exists at fork" in caplog.text and "per_process" in caplog.text
    finally:
        channel.close()
