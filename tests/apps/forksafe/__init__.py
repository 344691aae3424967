"""Sample monoliths that connect at import time, for the fork-safety proof (tests/process/test_fork_proof.py).

Each one opens its connections while it loads, as real apps do (a warm-up query, a health PING),
and answers every request with the worker's pid and the server-side identity of the connection
that served it. Lines that connect at import carry the marker `# connects at import`: under
`--fork-safety strict` refork must name one of them. Connection parameters come from the
REFORK_PROOF_* variables tests/support/services.py sets.
"""

from __future__ import annotations

import os

MARKER = "# connects at import"


def pg_settings() -> dict[str, str]:
    return {
        "host": os.environ["REFORK_PROOF_PG_HOST"],
        "port": os.environ["REFORK_PROOF_PG_PORT"],
        "user": os.environ["REFORK_PROOF_PG_USER"],
        "password": os.environ["REFORK_PROOF_PG_PASSWORD"],
        "dbname": os.environ["REFORK_PROOF_PG_DATABASE"],
    }
