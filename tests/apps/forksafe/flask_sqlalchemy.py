"""A Flask + SQLAlchemy app whose engine connects (a warm-up query) while it loads."""

import os

from flask import Flask, jsonify
from sqlalchemy import create_engine, text

from apps.forksafe import pg_settings

_pg = pg_settings()
engine = create_engine(
    f"postgresql+psycopg2://{_pg['user']}:{_pg['password']}@{_pg['host']}:{_pg['port']}/{_pg['dbname']}",
    pool_size=5,
    connect_args={"application_name": "refork-proof-sqlalchemy"},
)

with engine.connect() as warm:  # connects at import
    warm.execute(text("SELECT 1"))  # the connection goes back to the pool, still open

app = Flask(__name__)


@app.get("/")
def backend():
    with engine.connect() as conn:
        backend_pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return jsonify(worker_pid=os.getpid(), backend=backend_pid)
