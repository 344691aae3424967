"""h2spec, the HTTP/2 and HPACK conformance suite, against refork over h2c and over TLS, for ASGI
(asyncio, uvloop) and WSGI (the Python loop, and the native engines that hand h2c to it).

h2spec is a Go program: the `h2spec` fixture builds it once with `go install` (the module proxy)
into tests/clients/bin/ and keeps it there; no Go or no network is a failure, not a skip. Every
case must pass; a failure lists the cases h2spec printed.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import trustme
from support import paths

TESTS = paths.TESTS
BIN = TESTS / "clients" / "bin"
H2SPEC_VERSION = "v2.2.1+incompatible"  # (its repository has no go.mod)
H2SPEC_MODULE = f"github.com/summerwind/h2spec/cmd/h2spec@{H2SPEC_VERSION}"
# how a server is started: its app and loop flags
SERVERS = {
    "asgi-asyncio": ("apps.h2_apps:app", ("--loop", "asyncio")),
    "asgi-uvloop": ("apps.h2_apps:app", ("--loop", "uvloop")),
    "wsgi-python": ("apps.h2_apps:wsgi_app", ("--wsgi-loop", "python", "--threads", "4")),
    "wsgi-native": ("apps.h2_apps:wsgi_app", ("--wsgi-loop", "native", "--threads", "1")),
    "wsgi-native-pool": ("apps.h2_apps:wsgi_app", ("--wsgi-loop", "native", "--threads", "4")),
}


@pytest.fixture(scope="session")
def h2spec() -> Path:
    """The h2spec binary at H2SPEC_VERSION (built once: a cache)."""
    binary = BIN / "h2spec"
    stamp = BIN / "h2spec.version"
    BIN.mkdir(parents=True, exist_ok=True)
    with open(BIN / ".lock", "w") as lock:  # the suite's processes build it once, one at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (binary.exists() and stamp.exists() and stamp.read_text() == H2SPEC_VERSION):
            _build(binary, stamp)
    return binary


def _build(binary: Path, stamp: Path) -> None:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    assert go, "Go is needed to build h2spec (`go install`): install golang"
    result = subprocess.run([go, "install", H2SPEC_MODULE], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "GOBIN": str(BIN), "GOFLAGS": "-buildvcs=false"})  # fmt: skip
    if result.returncode != 0 or not binary.exists():
        pytest.fail(f"go install {H2SPEC_MODULE} failed (network?):\n{result.stdout}\n{result.stderr}")
    stamp.write_text(H2SPEC_VERSION)


def _run(h2spec: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(h2spec), "-h", "127.0.0.1", "-p", str(port), "-o", "5", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _verdict(result: subprocess.CompletedProcess[str], log: str) -> None:
    out = result.stdout
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    counts = re.fullmatch(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed", summary)
    if result.returncode != 0 or counts is None or counts[1] != counts[2] or int(counts[1]) < 145:
        failures = out.partition("Failures:")[2] or out[-4000:]
        raise AssertionError(f"h2spec: {summary}\n{failures}\n--- server log ---\n{log[-3000:]}")


@pytest.mark.parametrize("kind", list(SERVERS))
def test_h2spec_over_h2c(h2spec, start_server, kind):
    """A port for prior-knowledge h2c only (behind a load balancer), as h2spec expects of one."""
    app, flags = SERVERS[kind]
    server = start_server(*flags, "--http-protocols", "h2c", app=app, workers=1)
    _verdict(_run(h2spec, server.port), server.log())


@pytest.mark.parametrize("kind", list(SERVERS))
def test_h2spec_over_tls(h2spec, start_server, kind, tmp_path):
    """The default --http-protocols (h2,h1) on a TLS listener: h2spec picks h2 by ALPN."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    app, flags = SERVERS[kind]
    server = start_server(*flags, "--certfile", str(certfile), "--keyfile", str(keyfile), app=app,
                          workers=1)  # fmt: skip
    _verdict(_run(h2spec, server.port, "-t", "-k"), server.log())
