"""The environ the app is handed (PEP 3333): the CGI keys, SCRIPT_NAME from the root path, trusted
forwarding headers, and its streams: wsgi.input (in memory, spooled to a file, bounded by the spool's
cap) and wsgi.errors."""

from __future__ import annotations

import pytest
from support.wsgi_environ import env, req

from refork.http.body import EMPTY_INPUT, BodyBuffer, Spool
from refork.http.events import ParseError
from refork.http.forwarded import TrustedProxies
from refork.wsgi import FileWrapper

# ------------------------------------------------------------------------------ environ


def test_environ_basics():
    r = req(
        b"/a%20b/caf%C3%A9?x=1&y=%20",
        headers=[
            (b"host", b"example.com:8080"),
            (b"accept", b"text/html"),
            (b"accept", b"text/plain"),
            (b"content-type", b"text/plain"),
            (b"x_spoof", b"1"),
            (b"cookie", b"a=1"),
            (b"cookie", b"b=2"),
        ],
    )
    e = env(r)
    assert e["REQUEST_METHOD"] == "GET"
    assert e["SCRIPT_NAME"] == ""
    assert e["PATH_INFO"] == "/a b/caf\u00c3\u00a9"  # UTF-8 bytes as latin-1, per PEP 3333
    assert e["QUERY_STRING"] == "x=1&y=%20"
    assert e["SERVER_NAME"] == "example.com" and e["SERVER_PORT"] == "8080"
    assert e["SERVER_PROTOCOL"] == "HTTP/1.1"
    assert e["HTTP_ACCEPT"] == "text/html,text/plain"
    assert e["HTTP_COOKIE"] == "a=1; b=2"
    assert e["CONTENT_TYPE"] == "text/plain" and "HTTP_CONTENT_TYPE" not in e
    assert not any("SPOOF" in k for k in e)  # underscores could alias X-Spoof: dropped
    assert e["REMOTE_ADDR"] == "127.0.0.1" and e["REMOTE_PORT"] == "5555"
    assert e["wsgi.version"] == (1, 0) and e["wsgi.url_scheme"] == "http"
    assert e["wsgi.input"] is EMPTY_INPUT and e["wsgi.input_terminated"] is True
    assert e["wsgi.run_once"] is False and e["wsgi.multiprocess"] is True
    assert e["wsgi.file_wrapper"] is FileWrapper
    assert "CONTENT_LENGTH" not in e


def test_environ_script_name_from_root_path():
    e = env(req(b"/app/x/y"), root_path="/app/")
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "/x/y")
    e = env(req(b"/app"), root_path="/app")
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "")
    e = env(req(b"/application"), root_path="/app")
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "/application")
    e = env(req(b"/%61pp/z"), root_path="/app")  # compared after decoding
    assert (e["SCRIPT_NAME"], e["PATH_INFO"]) == ("/app", "/z")


def test_environ_server_name_without_host_and_ipv6_host():
    e = env(req(b"/", version="1.0", headers=[]), server=("10.1.2.3", 9000))
    assert (e["SERVER_NAME"], e["SERVER_PORT"], e["SERVER_PROTOCOL"]) == ("10.1.2.3", "9000", "HTTP/1.0")
    e = env(req(headers=[(b"host", b"[::1]:8443")]))
    assert (e["SERVER_NAME"], e["SERVER_PORT"]) == ("::1", "8443")
    e = env(req(headers=[(b"host", b"example.com")]))
    assert e["SERVER_PORT"] == "80"
    e = env(req(headers=[]), server="/run/app.sock", client=None)
    assert e["SERVER_NAME"] == "localhost" and e["REMOTE_ADDR"] == "" and "REMOTE_PORT" not in e


def test_environ_forwarded_trusted_and_untrusted():
    headers = [
        (b"host", b"example.com"),
        (b"x-forwarded-proto", b"https"),
        (b"x-forwarded-for", b"203.0.113.7, 10.0.0.2"),
    ]
    proxies = TrustedProxies(["127.0.0.1", "10.0.0.0/8"])
    trusted = env(req(headers=headers), client=("127.0.0.1", 1), proxies=proxies)
    assert trusted["wsgi.url_scheme"] == "https"
    assert trusted["SERVER_PORT"] == "443"
    assert trusted["REMOTE_ADDR"] == "203.0.113.7"
    untrusted = env(req(headers=headers), client=("192.0.2.1", 1), proxies=TrustedProxies(["127.0.0.1"]))
    assert untrusted["wsgi.url_scheme"] == "http"
    assert untrusted["SERVER_PORT"] == "80"
    assert untrusted["REMOTE_ADDR"] == "192.0.2.1"
    # a unix-socket peer follows --forwarded-allow-ips like any peer: trusted only with `unix:`
    unix = env(req(headers=headers), client=None, server="/tmp/s", proxies=TrustedProxies(["127.0.0.1"]))
    assert unix["wsgi.url_scheme"] == "http" and unix["REMOTE_ADDR"] == ""
    unix = env(req(headers=headers), client=None, server="/tmp/s", proxies=TrustedProxies(["unix:"]))
    assert unix["wsgi.url_scheme"] == "https" and unix["REMOTE_ADDR"] == "10.0.0.2"


def test_environ_content_length_of_chunked_body():
    buf = BodyBuffer(1 << 20)
    buf.write(b"hello ")
    buf.write(b"world")
    e = env(req(b"/", "POST", chunked=True), buf.finish())
    assert e["CONTENT_LENGTH"] == "11"
    assert e["wsgi.input"].read() == b"hello world"


# ------------------------------------------------------------------------------ wsgi.input


@pytest.mark.parametrize("threshold", [1 << 20, 8])
def test_input_stream(threshold):
    data = b"first line\nsecond\n\nlast without newline"
    buf = BodyBuffer(threshold)
    for i in range(0, len(data), 5):
        buf.write(data[i : i + 5])
    stream = buf.finish()
    assert stream.length == len(data)
    assert stream.read(5) == b"first"
    assert stream.readline() == b" line\n"
    assert stream.readline(3) == b"sec"
    assert stream.readline(-1) == b"ond\n"
    assert stream.readlines() == [b"\n", b"last without newline"]
    assert stream.read() == b"" and stream.read(10) == b"" and stream.readline() == b""
    stream.close()

    buf = BodyBuffer(threshold)
    buf.write(data)
    stream = buf.finish()
    assert list(stream) == data.splitlines(keepends=True)
    stream.close()
    buf = BodyBuffer(threshold)
    buf.write(data)
    stream = buf.finish()
    assert stream.readlines(12) == [b"first line\n", b"second\n"]
    assert stream.read(None) == b"\nlast without newline"
    stream.close()


def test_input_spools_to_a_file_past_the_threshold():
    buf = BodyBuffer(10)
    buf.write(b"x" * 8)
    assert buf._file is None
    buf.write(b"y" * 8)
    assert buf._file is not None
    stream = buf.finish()
    assert stream.read() == b"x" * 8 + b"y" * 8
    stream.close()
    assert EMPTY_INPUT.read() == b"" and list(EMPTY_INPUT) == [] and EMPTY_INPUT.readlines() == []


def test_a_spooled_body_holds_what_arrived_not_what_it_declares():
    spool = Spool(100)
    declared = BodyBuffer(10, spool, length=90)
    declared.write(b"x" * 20)  # spilled: 20 arrived of the 90 declared, and only 20 held
    assert spool.used == 20
    with pytest.raises(ParseError) as refused:  # 20 arrived + 81 declared > 100: not now
        BodyBuffer(10, spool, length=81).write(b"y" * 11)
    assert refused.value.status == 503
    with pytest.raises(ParseError) as never:  # more than the whole spool: never
        BodyBuffer(10, spool, length=101).write(b"w" * 11)
    assert never.value.status == 413
    small = BodyBuffer(10, spool, length=60)  # 20 + 60 fit
    small.write(b"z" * 11)
    assert spool.used == 31
    declared.write(b"x" * 60)
    small.write(b"z" * 9)
    assert spool.used == 100
    with pytest.raises(ParseError) as full:  # what arrives past the cap: 503
        small.write(b"z")
    assert full.value.status == 503
    declared.finish().close()
    small.discard()
    assert spool.used == 0


def test_a_full_spool_disk_is_a_507(monkeypatch):
    import errno
    import tempfile

    class Full:
        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            pass

    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: Full())
    spool = Spool(1000)
    buf = BodyBuffer(10, spool)
    with pytest.raises(ParseError) as full:
        buf.write(b"x" * 11)
    assert full.value.status == 507
    buf.discard()
    assert spool.used == 0


def test_wsgi_errors_goes_to_the_error_log(caplog):
    e = env(req())
    with caplog.at_level("ERROR", logger="refork"):
        e["wsgi.errors"].write("something odd\n")
        e["wsgi.errors"].writelines(["line a\n", "line b\n"])
        e["wsgi.errors"].flush()
    assert [r.getMessage() for r in caplog.records] == ["something odd", "line a", "line b"]
