"""Apps for tests/serving/test_native_engine.py: one response shape per path, the engine's fast path and
every way out of it (a generator, write(), a file, an error before or after start_response), and
a request that holds the GIL."""

import ctypes
import sys
import tempfile

HEADERS = [("Content-Type", "text/plain")]
CLOSED: list[str] = []  # who called each Body.close() (the function of the calling frame)
KEPT: list[object] = []  # what /keep requests held on to


class Body:
    """A response body that is not a list, as Django's HttpResponse and werkzeug's ClosingIterator
    are: iterable, with a close()."""

    def __init__(self, items, close_raises=False):
        self.items = items
        self.close_raises = close_raises

    def __iter__(self):
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item

    def close(self):
        CLOSED.append(sys._getframe(1).f_code.co_name)
        if self.close_raises:
            raise RuntimeError("close failed")


class ClosingFile:
    """A binary file whose close() is recorded in CLOSED, as Body's is."""

    def __init__(self, f):
        self.f = f

    def fileno(self):
        return self.f.fileno()

    def tell(self):
        return self.f.tell()

    def read(self, n=-1):
        return self.f.read(n)

    def close(self):
        CLOSED.append(sys._getframe(1).f_code.co_name)
        self.f.close()


def _sized(start_response, items, length=None, **kwargs):
    total = sum(len(i) for i in items if isinstance(i, bytes)) if length is None else length
    start_response("200 OK", [*HEADERS, ("Content-Length", str(total))])
    return Body(items, **kwargs)


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
    if path == "/file-sized":  # n bytes ("n"), with Content-Length: the engine sends it itself
        size = int(query or "100000")
        f = tempfile.TemporaryFile()  # noqa: SIM115 - the server closes it (the wrapper's close)
        f.write(b"s" * size)
        f.seek(0)
        start_response("200 OK", [*HEADERS, ("Content-Length", str(size))])
        return environ["wsgi.file_wrapper"](ClosingFile(f))
    if path == "/iterable":  # Content-Length set, a body that is not a list (Django, Flask)
        return _sized(start_response, [b"it", b"er", b"able"])
    if path == "/iterable-short":  # fewer bytes than its Content-Length: closed after it
        return _sized(start_response, [b"short"], length=9)
    if path == "/iterable-long":  # more bytes than its Content-Length: the Python path's error
        return _sized(start_response, [b"long", b"er"], length=4)
    if path == "/iterable-str":
        return _sized(start_response, [b"ok", "str"], length=5)
    if path == "/iterable-raises":
        return _sized(start_response, [b"ok", RuntimeError("while iterating")], length=5)
    if path == "/iterable-close-raises":
        return _sized(start_response, [b"closing"], close_raises=True)
    if path == "/iterable-stream":  # no Content-Length: a stream (chunked), never pulled ahead
        start_response("200 OK", HEADERS)
        return Body([b"s1", b"s2"])
    if path == "/closed":
        body = ",".join(CLOSED).encode()
        CLOSED.clear()
        start_response("200 OK", HEADERS)
        return [body]
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
    if path == "/keep":  # holds its start_response, environ or write ("query"): "fresh" if neither
        # its start_response nor its wsgi.early_hints is one an earlier /keep still holds
        mine = (start_response, environ["wsgi.early_hints"])
        held = [k["wsgi.early_hints"] if isinstance(k, dict) else k for k in KEPT]
        fresh = not any(o is h for o in mine for h in held)
        write = start_response("200 OK", HEADERS)
        KEPT.append({"start": start_response, "environ": environ, "write": write}[query])
        if query == "write":
            KEPT.append(start_response)  # (only to compare with: the write callable holds it)
        return [b"fresh" if fresh else b"reused"]
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
