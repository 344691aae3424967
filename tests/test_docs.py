"""docs/architecture.md's module map names every module of refork/ and native/src/, and nothing that is gone;
every code fence in the docs is closed.

The map is the first code block of the page: a tree, two spaces a level, one entry a line (a name
ending in `/`, `.py`, `.rs` or `.c`), its description beside it. A package's `__init__.py` is
described by the package's own line.
"""

from __future__ import annotations

import re
from pathlib import Path

from support import paths

ROOT = paths.ROOT
_ENTRY = re.compile(r"( *)([A-Za-z_][\w.]*(?:/|\.py|\.rs|\.c))(?:\s|$)")
_ROOTS = ("refork/", "native/src/")
_FENCE = re.compile(r" *```(.*)")


def _module_map() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return text.split("```", 2)[1]


def _named() -> set[str]:
    """The paths the map names: an entry's indent is its depth under the root above it; deeper
    lines are an entry's description running on."""
    named: set[str] = set()
    stack: list[str] = []
    for line in _module_map().splitlines():
        if line.startswith(_ROOTS):
            stack = [line.split()[0].rstrip("/")]
            continue
        entry = _ENTRY.match(line)
        depth = len(entry[1]) // 2 if entry else 0
        if not stack or entry is None or len(entry[1]) % 2 or not 0 < depth <= len(stack):
            continue
        del stack[depth:]
        name = entry[2]
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
        else:
            named.add("/".join([*stack, name]))
    return named


def _modules() -> set[str]:
    python = {p for p in ROOT.glob("refork/**/*.py") if p.name != "__init__.py"}
    rust = set(ROOT.glob("native/src/**/*.rs"))
    return {p.relative_to(ROOT).as_posix() for p in python | rust}


def test_architecture_names_every_module():
    missing = sorted(_modules() - _named())
    assert not missing, f"docs/architecture.md's module map does not name: {missing}"


def test_architecture_names_no_module_that_is_gone():
    gone = sorted(p for p in _named() if not (ROOT / p).is_file())
    assert not gone, f"docs/architecture.md's module map names what does not exist: {gone}"


def _unclosed_fences(path: Path) -> list[int]:
    """Lines where a fence opens and is never closed: a closing fence carries no info string, so one
    that does (```python) is the next block's opening swallowed by a fence left open above it."""
    opened = 0
    unclosed = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fence = _FENCE.fullmatch(line)
        if fence is None:
            continue
        if not opened:
            opened = number
        elif fence[1].strip():
            unclosed.append(opened)
            opened = number
        else:
            opened = 0
    return [*unclosed, opened] if opened else unclosed


def test_every_code_fence_in_the_docs_is_closed():
    unclosed = {
        path.relative_to(ROOT).as_posix(): lines
        for path in sorted([*ROOT.glob("docs/*.md"), ROOT / "README.md"])
        if (lines := _unclosed_fences(path))
    }
    assert not unclosed, f"code fences opened and never closed (file: lines): {unclosed}"
