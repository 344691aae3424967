"""WHERE A WSGI APP IS CALLED (PEP 3333): environ, start_response, write(), file_wrapper.

Nothing here knows about sockets, selectors or processes: the connection loop hands in a
complete request and an :class:`Output`, and gets back the status and the number of body bytes
written, or a :class:`Streaming` response to resume when its socket can take more.

`environ` builds the environ dict, `response` runs the app and frames what it returns,
`files` is ``wsgi.file_wrapper``, `warmup` runs requests in the mold before it forks. The
submodules import each other, never this package, which only re-exports.
"""

from refork.wsgi.environ import EnvironBuilder, ErrorStream
from refork.wsgi.files import FileWrapper
from refork.wsgi.response import (
    HOP_BY_HOP,
    Outcome,
    Output,
    Send,
    SendFailed,
    SendFile,
    Streaming,
    run_wsgi,
    start_wsgi,
)
from refork.wsgi.warmup import warmup_wsgi

__all__ = [
    "HOP_BY_HOP",
    "EnvironBuilder",
    "ErrorStream",
    "FileWrapper",
    "Outcome",
    "Output",
    "Send",
    "SendFailed",
    "SendFile",
    "Streaming",
    "run_wsgi",
    "start_wsgi",
    "warmup_wsgi",
]
