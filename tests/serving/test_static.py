"""--static's answers without sockets (refork.serving.static): one test per header rule, the
refusals, and a fuzz of request targets proving no byte outside the mount is ever served. The
same answers on every request path, over real HTTP, are tests/serving/test_static_paths.py's."""

from __future__ import annotations

import gzip
import os
import random
from email.utils import formatdate

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refork.serving.static import IMMUTABLE, SMALL, Answer, Mount, StaticFiles, byte_range, content_hashed

CSS = b"body { color: red }\n" * 50
SECRET = b"the secret outside the mount\n"


@pytest.fixture
def site(tmp_path):
    """A mount's directory beside files it must never serve (a secret, a .env inside, symlinks)."""
    root = tmp_path / "static"
    (root / "css").mkdir(parents=True)
    (root / "css" / "app.css").write_bytes(CSS)
    (root / "css" / "app.0123456789ab.css").write_bytes(CSS)
    (root / "plain.txt").write_bytes(b"hello\n")
    (root / "data.bin").write_bytes(bytes(range(256)))
    (root / ".env").write_bytes(SECRET)
    (root / "css" / ".hidden").mkdir()
    (root / "css" / ".hidden" / "x.css").write_bytes(SECRET)
    (tmp_path / "secret.txt").write_bytes(SECRET)
    (root / "out.txt").symlink_to(tmp_path / "secret.txt")
    (root / "outdir").symlink_to(tmp_path)
    (root / "in.txt").symlink_to(root / "plain.txt")
    return tmp_path


def files(site, **kw) -> StaticFiles:
    return StaticFiles([Mount.parse(f"/static={site / 'static'}")], **kw)


def ask(f: StaticFiles, target: bytes, method: str = "GET", **headers: str) -> Answer:
    answer = f.answer(method, target, {k.replace("_", "-"): v for k, v in headers.items()})
    assert answer is not None
    return answer


def body(answer: Answer) -> bytes:
    if answer.file is None:
        return answer.body
    answer.file.seek(answer.offset)
    try:
        return answer.file.read(answer.count)
    finally:
        answer.close()


def head(answer: Answer) -> dict[bytes, bytes]:
    return dict(answer.headers)


def test_a_file_has_its_type_length_validators_and_cache_control(site):
    a = ask(files(site, max_age=120), b"/static/css/app.css?v=1")
    h = head(a)
    assert (a.status, a.length, body(a)) == (200, len(CSS), CSS)
    assert h[b"content-type"] == b"text/css; charset=utf-8"
    assert h[b"etag"].startswith(b'"') and h[b"accept-ranges"] == b"bytes"
    mtime = os.stat(site / "static" / "css" / "app.css").st_mtime
    assert h[b"last-modified"] == formatdate(mtime, usegmt=True).encode()
    assert h[b"cache-control"] == b"public, max-age=120"
    assert b"vary" not in h


def test_head_has_the_get_fields_and_no_body(site):
    a = ask(files(site), b"/static/plain.txt", "HEAD")
    assert (a.status, a.file, a.body, a.length) == (200, None, b"", 6)
    assert head(a)[b"content-type"] == b"text/plain; charset=utf-8"


def test_other_methods_are_405_with_allow(site):
    a = ask(files(site), b"/static/plain.txt", "POST")
    assert a.status == 405 and head(a)[b"allow"] == b"GET, HEAD"


def test_paths_outside_every_mount_are_the_apps(site):
    f = files(site)
    assert f.answer("GET", b"/staticky/plain.txt", {}) is None
    assert f.answer("GET", b"/", {}) is None


@pytest.mark.parametrize(
    "name",
    [
        "app.0123456789ab.css",
        "main.3b2c1a9f.js",
        "vendor.min.3b2c1a9f8d7e.js",
        "index-Dx3k9_aZ.js",
        "chunk-4f3c2a1b.js",
        "main.3b2c1a9f.chunk.js",
    ],
)
def test_content_hashed_names_are_immutable(name):
    assert content_hashed(name)


@pytest.mark.parametrize(
    "name",
    [
        "app.css",
        "jquery-3.6.0.min.js",
        "app-Settings.js",
        "datepicker-ui.js",
        "report.20240101.csv",
        "favicon.ico",
        "README",
    ],
)
def test_other_names_are_not(name):
    assert not content_hashed(name)


def test_a_hashed_name_gets_a_year_immutable(site):
    assert head(ask(files(site), b"/static/css/app.0123456789ab.css"))[b"cache-control"] == IMMUTABLE


def test_if_none_match_is_304_and_wins_over_if_modified_since(site):
    f = files(site)
    etag = head(ask(f, b"/static/plain.txt"))[b"etag"].decode()
    a = ask(f, b"/static/plain.txt", if_none_match=f'"other", W/{etag}')
    assert (a.status, a.body, a.file) == (304, b"", None)
    assert head(a)[b"etag"] == etag.encode() and b"content-length" not in head(a)
    ims = formatdate(os.stat(site / "static" / "plain.txt").st_mtime + 10, usegmt=True)
    assert ask(f, b"/static/plain.txt", if_none_match='"other"', if_modified_since=ims).status == 200
    assert ask(f, b"/static/plain.txt", if_none_match="*").status == 304


def test_if_modified_since(site):
    f = files(site)
    mtime = os.stat(site / "static" / "plain.txt").st_mtime
    assert ask(f, b"/static/plain.txt", if_modified_since=formatdate(mtime + 1, usegmt=True)).status == 304
    assert ask(f, b"/static/plain.txt", if_modified_since=formatdate(mtime - 60, usegmt=True)).status == 200
    assert ask(f, b"/static/plain.txt", if_modified_since="not a date").status == 200


@pytest.mark.parametrize(
    ("spec", "span"),
    [
        ("bytes=0-9", (0, 9)),
        ("bytes=250-", (250, 255)),
        ("bytes=-6", (250, 255)),
        ("bytes=200-999", (200, 255)),
    ],
)
def test_one_range_is_206(site, spec, span):
    a = ask(files(site), b"/static/data.bin", range=spec)
    assert a.status == 206
    assert head(a)[b"content-range"] == b"bytes %d-%d/256" % span
    assert body(a) == bytes(range(256))[span[0] : span[1] + 1]


@pytest.mark.parametrize("spec", ["bytes=256-", "bytes=300-400", "bytes=-0"])
def test_an_unsatisfiable_range_is_416(site, spec):
    a = ask(files(site), b"/static/data.bin", range=spec)
    assert a.status == 416 and head(a)[b"content-range"] == b"bytes */256"


@pytest.mark.parametrize("spec", ["bytes=0-1,5-6", "items=0-1", "bytes=5-2", "bytes=x-", "bytes=-"])
def test_several_or_malformed_ranges_send_the_whole_file(site, spec):
    a = ask(files(site), b"/static/data.bin", range=spec)
    assert a.status == 200 and a.length == 256


def test_if_range_applies_the_range_only_to_the_same_file(site):
    f = files(site)
    etag = head(ask(f, b"/static/data.bin"))[b"etag"].decode()
    assert ask(f, b"/static/data.bin", range="bytes=0-1", if_range=etag).status == 206
    assert ask(f, b"/static/data.bin", range="bytes=0-1", if_range='"stale"').status == 200


def test_precompressed_siblings_by_accept_encoding_with_vary(site):
    css = site / "static" / "css" / "app.css"
    gz = gzip.compress(CSS)
    (site / "static" / "css" / "app.css.gz").write_bytes(gz)
    br = b"pretend-brotli"
    (site / "static" / "css" / "app.css.br").write_bytes(br)
    os.utime(css, (1, 1))  # the siblings are newer than the file: not stale
    f = files(site)
    plain, both = ask(f, b"/static/css/app.css"), ask(f, b"/static/css/app.css", accept_encoding="gzip, br")
    gzipped = ask(f, b"/static/css/app.css", accept_encoding="gzip, br;q=0")
    assert body(plain) == CSS and b"content-encoding" not in head(plain)
    assert head(both)[b"content-encoding"] == b"br" and body(both) == br
    assert head(gzipped)[b"content-encoding"] == b"gzip" and body(gzipped) == gz
    assert head(gzipped)[b"content-type"] == b"text/css; charset=utf-8"
    assert len({head(a)[b"etag"] for a in (plain, both, gzipped)}) == 3
    assert all(head(a)[b"vary"] == b"Accept-Encoding" for a in (plain, both, gzipped))


def test_a_changed_file_is_seen_at_once(site):
    f = files(site)
    first = head(ask(f, b"/static/plain.txt"))[b"etag"]
    path = site / "static" / "plain.txt"
    path.write_bytes(b"changed, and longer\n")
    a = ask(f, b"/static/plain.txt")
    assert head(a)[b"etag"] != first and body(a) == b"changed, and longer\n"


def test_small_files_are_sent_from_memory_and_big_ones_from_the_file(site):
    big = os.urandom(SMALL + 1)
    (site / "static" / "big.bin").write_bytes(big)
    f = files(site)
    small = ask(f, b"/static/plain.txt")
    assert (small.file, small.body) == (None, b"hello\n") and f.held == 6
    a = ask(f, b"/static/big.bin")
    assert a.file is not None and (a.offset, a.count) == (0, len(big)) and body(a) == big
    part = ask(f, b"/static/plain.txt", range="bytes=1-2")
    assert (part.status, part.body) == (206, b"el")


def test_a_changed_sibling_is_seen_at_once(site):
    css = site / "static" / "css" / "app.css"
    gz = site / "static" / "css" / "app.css.gz"
    gz.write_bytes(gzip.compress(CSS))
    os.utime(css, (1, 1))
    f = files(site)
    assert body(ask(f, b"/static/css/app.css", accept_encoding="gzip")) == gzip.compress(CSS)
    gz.write_bytes(b"new gzip bytes, a different size")
    assert body(ask(f, b"/static/css/app.css", accept_encoding="gzip")) == b"new gzip bytes, a different size"


def test_the_metadata_cache_is_bounded(site):
    f = files(site, cache_size=2)
    for name in (b"plain.txt", b"data.bin", b"css/app.css", b"in.txt"):
        ask(f, b"/static/" + name).close()
        assert len(f.cache) <= 2


@pytest.mark.parametrize("target", [
    b"/static/../secret.txt", b"/static/%2e%2e/secret.txt", b"/static/css/..%2f..%2fsecret.txt",
    b"/static/css%2fapp.css", b"/static/..\\secret.txt", b"/static/%5c..%5csecret.txt",
    b"/static/plain.txt%00", b"/static/.env", b"/static/%2eenv", b"/static/css/.hidden/x.css",
    b"/static//plain.txt", b"/static/./plain.txt", b"/static/out.txt", b"/static/outdir/secret.txt",
])  # fmt: skip
def test_escapes_dotfiles_and_symlinks_out_are_403_without_the_path(site, target):
    a = ask(files(site), target)
    assert a.status == 403 and a.body == b"403 Forbidden\n"


@pytest.mark.parametrize(
    "target", [b"/static", b"/static/", b"/static/css", b"/static/css/", b"/static/nope.css"]
)
def test_directories_are_never_listed_and_missing_files_are_404(site, target):
    a = ask(files(site), target)
    assert a.status == 404 and a.body == b"404 Not Found\n"


def test_symlinks_inside_the_mount_are_served_and_out_only_when_allowed(site):
    assert body(ask(files(site), b"/static/in.txt")) == b"hello\n"
    assert body(ask(files(site, follow_symlinks=True), b"/static/out.txt")) == SECRET


def test_the_longest_prefix_wins(site):
    f = StaticFiles(
        [Mount.parse(f"/static={site / 'static'}"), Mount.parse(f"/static/css={site / 'static'}")]
    )
    assert body(ask(f, b"/static/css/plain.txt")) == b"hello\n"


def test_byte_range_edges():
    assert byte_range("bytes=0-0", 0) == "unsatisfiable"
    assert byte_range("bytes=-5", 0) == "unsatisfiable"
    assert byte_range("bytes= 1 - 2 ", 10) == (1, 2)


# ---- the fuzz: no target, however built, gets a byte from outside the mount


_PIECES = [b"..", b".", b"%2e", b"%2E", b"%2e%2e", b"%2f", b"%2F", b"%5c", b"\\", b"/", b"//", b"%00",
           b"\x00", b"%252e", b"out.txt", b"outdir", b"secret.txt", b".env", b"css", b"app.css", b"plain.txt",
           b"%", b"?", b"#", b";", b"~", b"%c0%ae", b"..;", b"static"]  # fmt: skip


def _served_outside(site, answer: Answer) -> bool:
    data = body(answer)
    return SECRET in data


def _target(rng: random.Random) -> bytes:
    return b"/static/" + b"".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 8)))


def test_seeded_targets_never_serve_outside(site):
    f = files(site)
    rng = random.Random(37)
    for _ in range(5000):
        target = _target(rng)
        answer = f.answer("GET", target, {})
        assert answer is not None
        assert not _served_outside(site, answer), target
        assert b"secret" not in answer.body


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.one_of(st.sampled_from(_PIECES), st.binary(max_size=4)), min_size=1, max_size=8))
def test_hypothesis_targets_never_serve_outside(site, parts):
    answer = files(site).answer("GET", b"/static/" + b"".join(parts), {})
    assert answer is not None and not _served_outside(site, answer)


def test_the_wsgi_mount_reads_the_raw_target_in_origin_and_absolute_form(site):
    from refork.serving.static_apps import StaticWsgi

    counted: list[int] = []
    app = StaticWsgi(lambda environ, start: [b"the app"], files(site), counted.append)
    seen: list[str] = []
    for target in ("/static/plain.txt?x=1", "http://example.com/static/plain.txt", "/plain.txt"):
        environ = {"RAW_URI": target, "REQUEST_METHOD": "GET", "PATH_INFO": target}
        result = app(environ, lambda status, headers: seen.append(status))
        assert b"".join(result) in (b"hello\n", b"the app")
        getattr(result, "close", lambda: None)()
    assert seen == ["200 OK", "200 OK"] and counted == [200, 200]


def test_percent_encoded_names_are_decoded_once(site):
    (site / "static" / "café menu.txt").write_bytes(b"menu\n")
    (site / "static" / "100%.txt").write_bytes(b"full\n")
    f = files(site)
    assert body(ask(f, b"/static/caf%C3%A9%20menu.txt")) == b"menu\n"
    assert body(ask(f, b"/static/100%25.txt")) == b"full\n"
    assert ask(f, b"/static/100%2525.txt").status == 404  # not decoded twice
