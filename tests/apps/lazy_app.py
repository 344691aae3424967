"""A WSGI app that imports lazily (PEP 810 syntax: CPython 3.15+ only).

GET / answers which of its lazy bindings were still placeholders when the request came
(`lazy_import`) and which modules this worker had to import itself, then uses them.
"""

import sys
lazy import json
lazy import xml.dom.minidom
lazy from decimal import Decimal
lazy from fractions import Fraction as F

lazy import refork_no_such_module  # noqa: F401 - fails on first use, in the mold as in a worker


def bindings() -> dict[str, str]:
    """The type of each lazy binding, read without resolving it."""
    namespace = globals()
    return {name: type(namespace[name]).__name__ for name in ("json", "xml", "Decimal", "F")}


def use() -> str:
    element = xml.dom.minidom.Document().createElement("a")
    return json.dumps([str(Decimal(1) / 8), str(F(1, 3)), element.tagName])


def app(environ, start_response):
    before = bindings()
    missing = sorted(m for m in ("json", "xml.dom.minidom", "decimal", "fractions") if m not in sys.modules)
    body = json.dumps({"bindings": before, "imported_by_worker": missing, "use": use()}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
