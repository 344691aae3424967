#!/usr/bin/env bash
# Create benchmarks/real_django/.venv-<major.minor> for one interpreter: Wagtail (a real open-source
# Django CMS, from PyPI), WhiteNoise, gunicorn and this checkout of refork (editable).
# Usage: benchmarks/real_django/setup.sh [PYTHON]      (default: python3)
# Idempotent. WAGTAIL="wagtail==7.2" pins another Wagtail (e.g. when the newest does not install).
set -euo pipefail

PY="${1:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VER="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
VENV="$HERE/.venv-$VER"

# jemalloc for refork's --allocator jemalloc row.
if ! ldconfig -p | grep -q libjemalloc.so.2; then
    if [[ "$(id -u)" == 0 ]]; then
        apt-get update -qq && apt-get install -y -qq libjemalloc2
    else
        echo "warning: libjemalloc2 is missing; the jemalloc row will fail (apt-get install libjemalloc2)" >&2
    fi
fi

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip wheel setuptools setuptools-rust
"${PIP[@]}" "${WAGTAIL:-wagtail}" whitenoise gunicorn
"${PIP[@]}" -e "$ROOT" --config-settings editable_mode=compat

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import sys

print("python", sys.version.split()[0])
for name in ("refork", "gunicorn", "wagtail", "django", "whitenoise", "pillow", "willow"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} (not installed)")
PY
echo "venv: $VENV"
