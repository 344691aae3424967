"""`refork status`, `refork refork`, `refork reload`: ask a running monitor over its control socket."""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from refork.config import setting_named
from refork.memory.accounting import format_bytes
from refork.process.control import ControlError, default_path, request

# C0 controls, DEL, C1 controls (ESC and CSI start terminal escape sequences) and the bidi
# overrides that reorder what a terminal shows: printed as \xNN / \uNNNN text, never raw.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """A value from the server as text that cannot drive the terminal."""
    return _UNPRINTABLE.sub(_escape, str(value))


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


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
    except ControlError as e:
        print(f"refork: error: {printable(e)}", file=sys.stderr)
        return 2
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
        print(json.dumps(answer, indent=2))  # ensure_ascii: controls are \u001b escapes already
    elif args.command == "status" and answer.get("ok"):
        try:
            table = format_status(answer)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            print(f"refork: error: {path}: not a status answer ({printable(repr(e))})", file=sys.stderr)
            return 2
        print(table)
    else:
        print(printable(answer.get("error") or answer.get("message") or "ok"))
    return 0 if answer.get("ok") is True else 1


def format_status(status: dict[str, Any]) -> str:
    def size(value: int | None) -> str:
        return "-" if value is None else format_bytes(value)

    header = ("PID", "ROLE", "GEN", "STATE", "REQS", "RSS", "PSS", "USS", "PRIV_DIRTY", "MINFLT", "NOTE")
    rows: list[tuple[str, ...]] = [header]
    for p in status["processes"]:
        role = p["role"] if p["role"] == "mold" else f"worker {p['nr']}"
        note = p.get("fork_unsafe") and f"fork-unsafe: {p['fork_unsafe']}" or p.get("retiring") or ""
        if p.get("overdue"):
            note = f"{p['overdue']} hung (past --request-timeout)" + (f"; {note}" if note else "")
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
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        printable(
            f"monitor {status['monitor_pid']}  gen {status['generation']}  workers {status['workers']}  "
            f"allocator {status['allocator']}  total PSS {format_bytes(status['total_pss'])}"
            + ("  (refork in progress)" if status.get("refork_pending") else "")
            + ("  (mold stopped while idle)" if status.get("mold_shed") else "")
        )
    ]
    for row in rows:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    return "\n".join(lines)
