"""A Flask + SQLAlchemy app with a Redis cache, both used (a warm-up query, a PING) while it loads."""

import os

import redis
from flask import Flask, jsonify
from sqlalchemy import create_engine, text

from apps.forksafe import pg_settings

_pg = pg_settings()
engine = create_engine(
    f"postgresql+psycopg2://{_pg['user']}:{_pg['password']}@{_pg['host']}:{_pg['port']}/{_pg['dbname']}",
    pool_size=5,
    connect_args={"application_name": "refork-proof-sqlalchemy"},
)
cache = redis.Redis.from_url(os.environ["REFORK_PROOF_REDIS_URL"], client_name="refork-proof-flask")


def current_backend() -> int:
    with engine.connect() as conn:  # connects at import
        return conn.execute(text("SELECT pg_backend_pid()")).scalar_one()  # back to the pool, still open


IMPORT_BACKEND = current_backend()  # connects at import
IMPORT_CACHE_CLIENT = cache.client_id()  # connects at import

app = Flask(__name__)


@app.get("/")
def identity():
    return jsonify(
        worker_pid=os.getpid(),
        backend=current_backend(),
        import_backend=IMPORT_BACKEND,
        cache_client=cache.client_id(),
        import_cache_client=IMPORT_CACHE_CLIENT,
    )
