"""Apps for tests/test_native_engine.py: one response shape per path, the engine's fast path and
every way out of it (a generator, write(), a file, an error before or after start_response), and
a request that holds the GIL."""

import ctypes
import tempfile

HEADERS = [("Content-Type", "text/plain")]


def app(environ, start_response):
    path = environ["PATH_INFO"]
    query = environ["QUERY_STRING"]
    if path == "/echo":
        body = environ["wsgi.input"].read()
        start_response("200 OK", HEADERS)
        return [b"echo:", body]
    if path == "/big":  # a list body of n bytes ("n=..."): framed natively up to 64 KiB
        start_response("200 OK", HEADERS)
        return [b"b" * int(query or "60000")]
    if path == "/gen":
        start_response("200 OK", HEADERS)
        return (part for part in (b"g1", b"g2"))
    if path == "/write":
        write = start_response("200 OK", [("Content-Length", "6")])
        write(b"wr")
        return [b"itten"[:4]]
    if path == "/file":
        f = tempfile.TemporaryFile()  # noqa: SIM115 - the server closes it (the wrapper's close)
        f.write(b"f" * 100_000)
        f.seek(0)
        start_response("200 OK", HEADERS)
        return environ["wsgi.file_wrapper"](f)
    if path == "/hold":  # "s": hold the GIL for s seconds (a C call that does not release it)
        ctypes.PyDLL(None).usleep(int(float(query) * 1e6))
        start_response("200 OK", HEADERS)
        return [b"held"]
    if path == "/boom":
        raise RuntimeError("boom before start_response")
    if path == "/late":
        start_response("200 OK", HEADERS)
        raise RuntimeError("boom after start_response")
    if path == "/bad-status":
        start_response("OK", HEADERS)
        return [b"never"]
    if path == "/twice":
        start_response("200 OK", HEADERS)
        start_response("200 OK", HEADERS)
        return [b"never"]
    if path == "/replaced":  # an error page instead, with exc_info (PEP 3333)
        start_response("200 OK", HEADERS)
        try:
            raise ValueError("replaced")
        except ValueError:
            import sys

            start_response("503 Service Unavailable", [("Content-Type", "text/plain")], sys.exc_info())
        return [b"sorry"]
    body = f"{environ['REQUEST_METHOD']} {path}?{query} {environ.get('HTTP_X_TEST', '-')}".encode()
    start_response("200 OK", HEADERS)
    return [body]
