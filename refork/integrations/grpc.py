"""gRPC: fork support switched on before the app imports grpc; channels alive at a fork named.

gRPC's core runs threads and holds epoll state; with GRPC_ENABLE_FORK_SUPPORT it stops them
around fork() and resets channels in the child. It reads the variable when grpc is imported,
so the mold sets it first (when grpc is installed, found without importing it).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from refork.integrations.base import Integration


def prepare_environment() -> str | None:
    """Set GRPC_ENABLE_FORK_SUPPORT=true unless set; the variable set, or None."""
    if "GRPC_ENABLE_FORK_SUPPORT" in os.environ:
        return None
    try:
        installed = importlib.util.find_spec("grpc") is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        return None
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "true"
    return "GRPC_ENABLE_FORK_SUPPORT=true"


def channel_warnings(objects: list[Any]) -> list[str]:
    return [
        f"a gRPC channel {channel!r} exists at fork: workers share its state; create channels in the "
        "worker (refork.per_process(lambda: grpc.insecure_channel(...)))"
        for channel in objects
    ]


INTEGRATION = Integration(
    "grpc", ("grpc",), ("grpc:Channel", "grpc.aio:Channel"), warnings=channel_warnings
)
