"""access_apps' `wsgi` and `asgi`, in a worker that notes each --static answer Python decides
(refork.serving.static.StaticFiles.answer) as one line in the file $STATIC_PROBE: the requests
the native engine answers again from its static cache leave none."""

from __future__ import annotations

import os
from typing import Any

from apps.access_apps import asgi, wsgi
from refork.serving.static import StaticFiles

__all__ = ["asgi", "wsgi"]
_decide = StaticFiles.answer


def _noted(self: StaticFiles, method: str, target: bytes, headers: Any) -> Any:
    with open(os.environ["STATIC_PROBE"], "a") as f:
        f.write(f"{method} {target.decode('latin-1')}\n")
    return _decide(self, method, target, headers)


StaticFiles.answer = _noted  # type: ignore[method-assign]
