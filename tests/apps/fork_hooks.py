"""An app that uses refork's fork API and libraries the built-in integrations fix.

REFORK_TEST_HOOKS=PATH: each @refork hook appends "<hook> <pid>" to PATH.
REFORK_TEST_FILES=DIR: opens DIR/kept.txt (refork.keep_fd) and DIR/shared.txt at import.
REFORK_TEST_REDIS=PORT: a redis-py client that PINGs 127.0.0.1:PORT at import.
GET / returns JSON: pid, the per_process object's pid, random draws, what each file fd points at,
and (with redis) the server-side id of this process's redis connection.
"""

import json
import os
import random

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # no BLAS thread pool: the mold holds no native thread
import numpy  # noqa: E402

import refork  # noqa: E402

HOOKS = os.environ.get("REFORK_TEST_HOOKS")
FILES = os.environ.get("REFORK_TEST_FILES")
REDIS = os.environ.get("REFORK_TEST_REDIS")


def _note(hook: str) -> None:
    if HOOKS:
        with open(HOOKS, "a") as f:
            f.write(f"{hook} {os.getpid()}\n")


@refork.before_fork
def _before_fork():
    _note("before_fork")


@refork.after_fork
def _after_fork():
    _note("after_fork")


@refork.before_promotion
def _before_promotion():
    _note("before_promotion")


numpy.random.seed(7)  # the legacy global generator, used while loading (a model's init, say)

built = refork.per_process(lambda: {"pid": os.getpid()})
assert built["pid"] == os.getpid()  # used while loading: built in the mold, rebuilt in each worker

kept = shared = None
if FILES:
    kept = open(os.path.join(FILES, "kept.txt"))  # noqa: SIM115 - held for the process's life
    refork.keep_fd(kept)
    shared = open(os.path.join(FILES, "shared.txt"))  # noqa: SIM115

client = None
if REDIS:
    import redis

    client = redis.Redis(host="127.0.0.1", port=int(REDIS))
    client.ping()


def _target(f):
    return os.readlink(f"/proc/self/fd/{f.fileno()}") if f else None


def app(environ, start_response):
    body = {
        "pid": os.getpid(),
        "built": built["pid"],
        "random": random.random(),
        "numpy": int(numpy.random.randint(0, 2**31)),
        "kept": _target(kept),
        "shared": _target(shared),
    }
    if client is not None:
        body["redis"] = client.client_id()
    data = json.dumps(body).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
