"""X-Worker-Pid on every response (static files too: it sits outside WhiteNoise), so the load
client counts the requests each worker served, whichever server runs the app."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def worker_pid(get_response: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def middleware(request: Any) -> Any:
        response = get_response(request)
        response["X-Worker-Pid"] = str(os.getpid())
        return response

    return middleware
