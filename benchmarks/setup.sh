#!/usr/bin/env bash
# Create benchmarks/.venv-<major.minor> for one interpreter and install refork + the peer servers.
# Usage: benchmarks/setup.sh [PYTHON]      (default: python3)
# Idempotent: re-running reuses the venv and only installs what is missing.
set -euo pipefail

PY="${1:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VER="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
VENV="$HERE/.venv-$VER"

# System packages: bjoern needs libev headers, the load generators are wrk and (HTTP/2) h2load;
# nginx is a peer of benchmarks/static_files.py.
missing=()
dpkg -s libev-dev >/dev/null 2>&1 || missing+=(libev-dev)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v h2load >/dev/null 2>&1 || missing+=(nghttp2-client)
command -v nginx >/dev/null 2>&1 || missing+=(nginx-light)
if ((${#missing[@]})); then
    if [[ "$(id -u)" == 0 ]]; then
        apt-get update -qq && apt-get install -y -qq "${missing[@]}"
    else
        echo "warning: missing ${missing[*]}; install them (apt-get install ${missing[*]})" >&2
    fi
fi

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)

"${PIP[@]}" --upgrade pip wheel setuptools
"${PIP[@]}" gunicorn "uvicorn[standard]" granian psutil
# HTTP/2 peers (benchmarks/http2.py): hypercorn (granian and gunicorn speak it already).
"${PIP[@]}" hypercorn
# ASGI frameworks (benchmarks/asgi_frameworks.py): FastAPI (and Starlette, which it brings).
"${PIP[@]}" fastapi
# WebSocket peers (benchmarks/websocket.py): uvicorn --ws websockets and --ws wsproto.
"${PIP[@]}" websockets wsproto
# Static files (benchmarks/static_files.py): WhiteNoise (granian's mount and gunicorn are above).
"${PIP[@]}" whitenoise
# Plots (benchmarks/memory_creep.py draws docs/memory-creep.png); never a test dependency.
"${PIP[@]}" matplotlib
# bjoern builds a C extension against libev.
"${PIP[@]}" bjoern || echo "warning: bjoern failed to install; it will be reported as failed" >&2
# benchmarks/django_pg.py (issue 12): Django on PostgreSQL (psycopg 3 and its pool), and py-spy to
# profile a worker when a target is missed. The PostgreSQL server itself is Debian's package.
"${PIP[@]}" django "psycopg[binary]" psycopg_pool py-spy
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    if [[ "$(id -u)" == 0 ]]; then
        apt-get update -qq && apt-get install -y -qq postgresql
    else
        echo "warning: PostgreSQL is missing; benchmarks/django_pg.py needs it (apt-get install postgresql)" >&2
    fi
fi
# The server under test; it is still being written, so a failing build is not fatal.
# compat mode: a plain path entry, so modules added to the tree later are picked up.
"${PIP[@]}" -e "$ROOT[uvloop]" --config-settings editable_mode=compat || echo "warning: refork failed to install; it will be reported as failed" >&2

# The WebSocket load client (benchmarks/wsload, Rust: tokio + tokio-tungstenite). cargo builds
# incrementally, so a re-run with nothing changed is a no-op.
if command -v cargo >/dev/null 2>&1; then
    (cd "$HERE/wsload" && cargo build --release --locked -q) ||
        echo "warning: benchmarks/wsload failed to build; benchmarks/websocket.py needs it" >&2
else
    echo "warning: cargo not found; benchmarks/websocket.py needs benchmarks/wsload (cargo build --release)" >&2
fi

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sys

print("python", sys.version.split()[0])
for name in ("refork", "gunicorn", "uvicorn", "httptools", "uvloop", "granian", "bjoern", "psutil", "matplotlib",
             "websockets", "wsproto", "whitenoise", "django", "psycopg", "psycopg-pool", "py-spy"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} (not installed)")
PY
echo "venv: $VENV"
