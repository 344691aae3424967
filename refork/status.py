"""`refork status`, `refork refork`, `refork reload`: ask a running monitor over its control socket."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from refork.config import setting_named
from refork.memory.accounting import format_bytes
from refork.process.control import default_path, request


def run(argv: list[str]) -> int:
    """Only the two settings that locate the socket are read, spelled as the server spells them."""
    socket_setting, name_setting = setting_named("control_socket"), setting_named("proc_name")
    parser = argparse.ArgumentParser(prog=f"refork {argv[0] if argv else 'status'}")
    parser.add_argument("command", choices=["status", "refork", "reload", "ttin", "ttou"])
    parser.add_argument(
        *socket_setting.flags,
        dest="control_socket",
        metavar=socket_setting.metavar,
        help="the monitor's control socket (default: from --name)",
    )
    parser.add_argument(
        *name_setting.flags,
        dest="proc_name",
        metavar=name_setting.metavar,
        default=name_setting.default,
        help=f"the server's --name (default: {name_setting.default})",
    )
    parser.add_argument("--json", action="store_true", help="print the raw JSON answer")
    args = parser.parse_args(argv)
    path = args.control_socket or default_path(args.proc_name)
    try:
        answer = request(path, args.command)
    except (FileNotFoundError, ConnectionRefusedError):
        print(
            f"refork: error: no refork monitor at {path}; is it running? (set --control-socket)",
            file=sys.stderr,
        )
        return 2
    except OSError as e:
        print(f"refork: error: {path}: {e.strerror or e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(answer, indent=2))
    elif args.command == "status" and answer.get("ok"):
        print(format_status(answer))
    else:
        print(answer.get("error") or answer.get("message") or "ok")
    return 0 if answer.get("ok") else 1


def format_status(status: dict[str, Any]) -> str:
    def size(value: int | None) -> str:
        return "-" if value is None else format_bytes(value)

    header = ("PID", "ROLE", "GEN", "STATE", "REQS", "RSS", "PSS", "USS", "PRIV_DIRTY", "MINFLT", "NOTE")
    rows = [header]
    for p in status["processes"]:
        role = p["role"] if p["role"] == "mold" else f"worker {p['nr']}"
        note = p.get("fork_unsafe") and f"fork-unsafe: {p['fork_unsafe']}" or p.get("retiring") or ""
        rows.append(
            (
                str(p["pid"]),
                role,
                str(p["generation"]),
                p["state"],
                str(p["requests"]),
                size(p["rss"]),
                size(p["pss"]),
                size(p["uss"]),
                size(p["private_dirty"]),
                "-" if p["minflt"] is None else str(p["minflt"]),
                note,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        f"monitor {status['monitor_pid']}  gen {status['generation']}  workers {status['workers']}  "
        f"allocator {status['allocator']}  total PSS {format_bytes(status['total_pss'])}"
        + ("  (refork in progress)" if status.get("refork_pending") else "")
        + ("  (mold stopped while idle)" if status.get("mold_shed") else "")
    ]
    for row in rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return "\n".join(lines)
