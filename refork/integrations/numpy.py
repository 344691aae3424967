"""numpy: the legacy global generator (`numpy.random.rand()`...) reseeded in each worker.

Without it every worker continues the mold's sequence: they all draw the same "random" numbers.
The stdlib `random` is reseeded by the worker itself (and by CPython's own fork hook).
"""

from __future__ import annotations

import sys
from typing import Any

from refork.integrations.base import Integration


def reseed(objects: list[Any]) -> None:
    random = sys.modules.get("numpy.random")  # numpy 2 loads it on first use: then seeded fresh
    if random is not None:
        random.seed()


INTEGRATION = Integration("numpy", ("numpy",), after_fork=reseed)
