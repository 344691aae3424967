"""Where an ASGI app is called: scope, the response message state machine, receive/send, lifespan.

:func:`build_scope` (`scope`) and :class:`ResponseState` (`response`) are sans-IO: a request
event goes in, a scope dict comes out; ``send()`` messages go in, bytes come out.
:class:`HttpCycle` (`cycle`) is the app-facing receive()/send() pair of one request, with one
explicit :class:`CycleState`; the connection (:mod:`refork.serving.asgi.server`) drives it and it
answers only through the :class:`Channel`. `lifespan` drives the lifespan scope, `warmup` runs
requests in the mold before it forks. The submodules import each other, never this package,
which only re-exports.
"""

from refork.asgi.cycle import HIGH_WATER, Channel, ClientDisconnected, CycleState, HttpCycle
from refork.asgi.lifespan import Lifespan, LifespanFailure
from refork.asgi.response import ResponseState
from refork.asgi.scope import ASGI_INFO, HTTP_EXTENSIONS, build_scope, decode_path, request_state
from refork.asgi.warmup import warmup_asgi

__all__ = [
    "ASGI_INFO",
    "HTTP_EXTENSIONS",
    "HIGH_WATER",
    "Channel",
    "ClientDisconnected",
    "CycleState",
    "HttpCycle",
    "Lifespan",
    "LifespanFailure",
    "ResponseState",
    "build_scope",
    "decode_path",
    "request_state",
    "warmup_asgi",
]
