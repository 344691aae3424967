"""No import cycle in refork, type-only ones included, not even between a package and its own submodules.

import-linter's contracts (pyproject.toml, run by ./scripts/test) forbid cycles between siblings
and enforce the layers; a cycle through a package's __init__ (`refork.serving` importing
`refork.serving.asgi.server`, which imports `refork.serving` back) is invisible to them, so this test looks
at every import edge: it is on a cycle if the imported module leads back to the importer. Imports
under ``if TYPE_CHECKING:`` count: a lower module that names its owner's class depends on it all
the same (the layers point down), so it states what it needs as a Protocol instead
(refork/serving/asgi/roles.py, refork/serving/wsgi/roles.py) and the owner satisfies it.
"""

from __future__ import annotations

import grimp


def test_no_module_imports_itself_back() -> None:
    graph = grimp.build_graph("refork", exclude_type_checking_imports=False, cache_dir=None)
    cycles = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                cycle = (importer, *back)
                start = cycle.index(min(cycle[:-1]))  # one spelling per cycle: rotate to its least module
                cycles.add(" -> ".join(cycle[start:-1] + cycle[:start] + (cycle[start],)))
    assert not cycles, "import cycles:\n" + "\n".join(sorted(cycles))
