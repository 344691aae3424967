"""An app whose import fails while the file named by REFORK_TEST_BREAK exists (bad deploys)."""

import os

if os.path.exists(os.environ.get("REFORK_TEST_BREAK", "/nonexistent")):
    raise RuntimeError("broken deploy")


def app(environ, start_response):
    body = f"{os.getpid()}".encode()
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]
