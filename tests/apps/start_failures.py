"""Apps whose start fails in a given phase, for the start-failure tests.

REFORK_TEST_CRASH picks what happens:
- "import": SIGSEGV while the mold imports the app
- "exit-message" / "exit-code": sys.exit("SECRET_KEY is not set") / sys.exit(4) at import
- "mold-if-immortal" / "worker-if-immortal": SIGSEGV in the mold before it forks a worker, or in
  a worker right after its fork, only while the heap is immortal (what a refcount layout refork
  got wrong for a new interpreter could do): the immortalization fallback must save the start
"""

import os
import signal
import sys

import refork
from refork.memory.heap import is_immortal

CRASH = os.environ.get("REFORK_TEST_CRASH", "")
MARKER = ["an object of the app's heap"]


def _segfault() -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


if CRASH == "import":
    _segfault()
elif CRASH == "exit-message":
    sys.exit("SECRET_KEY is not set")
elif CRASH == "exit-code":
    sys.exit(4)


@refork.before_fork
def _in_the_mold() -> None:
    if CRASH == "mold-if-immortal" and is_immortal(MARKER):
        _segfault()


@refork.after_fork
def _in_the_worker() -> None:
    if CRASH == "worker-if-immortal" and is_immortal(MARKER):
        _segfault()


def app(environ, start_response):
    body = f"{os.getpid()} immortal={is_immortal(MARKER)}".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
