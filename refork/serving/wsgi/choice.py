"""Which WSGI loop a worker runs (``--wsgi-loop``): the native engines, or the Python loop.

``python``; ``native`` (a config error when the extension refork._native is not built); ``auto`` =
native when the extension imports. See docs/native.md.
"""

from __future__ import annotations

from refork.errors import ConfigError

try:
    from refork import _native  # typed by refork/_native.pyi
except ImportError:  # not built: --wsgi-loop auto serves with the Python loop
    _native = None  # type: ignore[assignment]


def available() -> bool:
    """The extension is built and imports."""
    return _native is not None


def check(setting: str) -> None:
    """``--wsgi-loop native`` without the extension: one readable config error (exit 2)."""
    if setting == "native" and not available():
        raise ConfigError(
            "--wsgi-loop native: the native extension refork._native is not built "
            "(reinstall with `pip install -e .` where cargo is on PATH, or use --wsgi-loop python)"
        )


def choose(setting: str) -> str:
    """The loop that runs for this setting: "native" or "python"."""
    if setting == "python":
        return "python"
    if available():
        return "native"
    check(setting)
    return "python"
