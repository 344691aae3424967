"""`refork status`, `refork refork`, `refork reload`: ask a running monitor over its control socket."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from typing import Any, TextIO

from refork.config import setting_named
from refork.memory.accounting import format_bytes
from refork.process.control import ControlError, default_path, request, servers

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
    parser.add_argument(
        "-b",
        "--bind",
        dest="bind",
        metavar="ADDR",
        help="the server's first --bind address, when several servers run (default: the only one)",
    )
    parser.add_argument("--json", action="store_true", help="print the raw JSON answer")
    parser.add_argument(
        "--watch",
        nargs="?",
        const=WATCH_DEFAULT,
        type=_watch_seconds,
        metavar="SECONDS",
        help=f"status only: refresh every SECONDS (default {WATCH_DEFAULT:g}) until Ctrl-C",
    )
    args = parser.parse_args(argv)
    path = args.control_socket or _find(args.proc_name, args.bind)
    if path is None:
        return 2
    if args.watch is not None:
        if args.command != "status" or args.json:
            parser.error("--watch goes with `status`, without --json")
        return watch(path, args.watch)
    answer = _ask(path, args.command)
    if answer is None:
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


def _find(proc_name: str, bind: str | None) -> str | None:
    """The control socket of the one server this user runs with --name `proc_name` (or of the
    one on `bind`); None after one line when several run and none was picked."""
    if bind is not None:
        return default_path(proc_name, bind)
    live = servers(proc_name)
    if len(live) > 1:
        names = ", ".join(os.path.basename(p)[len(proc_name) + 1 : -4] for p in live)
        pick = "pick one with -b ADDR or --control-socket"
        print(f"refork: error: several refork servers run ({names}); {pick}", file=sys.stderr)
        return None
    return live[0] if live else default_path(proc_name)


def _ask(path: str, command: str) -> dict[str, Any] | None:
    """The monitor's answer, or None after one line on stderr saying why there is none."""
    try:
        return request(path, command)
    except ControlError as e:
        print(f"refork: error: {printable(e)}", file=sys.stderr)
    except (FileNotFoundError, ConnectionRefusedError):
        print(
            f"refork: error: no refork monitor at {path}; is it running? (set --control-socket)",
            file=sys.stderr,
        )
    except OSError as e:
        print(f"refork: error: {path}: {e.strerror or e}", file=sys.stderr)
    return None


# ---------------------------------------------------------------------------- status --watch

WATCH_DEFAULT = 2.0
# On a terminal each refresh redraws in place, like watch(1): cursor home, every line cleared to
# its end, the rest of the screen cleared below; the first frame clears the screen once.
_HOME, _CLEAR_SCREEN, _CLEAR_LINE, _CLEAR_BELOW = "\x1b[H", "\x1b[2J", "\x1b[K", "\x1b[J"


def _watch_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0.05 <= value <= 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text} seconds: use 0.05 to 86400")
    return value


def watch(path: str, interval: float, out: TextIO | None = None) -> int:
    """`refork status --watch`: the status table every `interval` seconds until Ctrl-C (exit 0).

    On a terminal the table is redrawn in place; otherwise the tables follow each other, each
    headed by the time, for a log or a pipe. The server going away ends it with one line and
    exit status 1 (2 if there was no server to begin with, like `refork status`).
    """
    out = out or sys.stdout
    tty = out.isatty()
    previous: tuple[float, dict[str, Any]] | None = None
    try:
        # Ctrl-C stops it even when started by a parent that ignores SIGINT (nohup, some CI
        # runners): Python keeps an inherited SIG_IGN, and then nothing short of a kill would.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        while True:
            answer = _ask(path, "status") if previous is None else _ask_again(path)
            if answer is None:
                return 2 if previous is None else 1
            now = time.monotonic()
            if not answer.get("ok"):
                print(f"refork: error: {printable(answer.get('error') or answer)}", file=sys.stderr)
                return 1
            try:
                frame = watch_frame(answer, interval, previous and (now - previous[0], previous[1]))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                print(f"refork: error: {path}: not a status answer ({printable(repr(e))})", file=sys.stderr)
                return 2
            if tty:
                lines = frame.split("\n")
                head = _HOME + (_CLEAR_SCREEN if previous is None else "")
                out.write(head + "".join(line + _CLEAR_LINE + "\n" for line in lines) + _CLEAR_BELOW)
            else:
                out.write(frame + "\n\n")
            out.flush()
            previous = (now, answer)
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `refork status --watch | head`: the reader left, that's fine
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        except (OSError, ValueError):
            pass
        return 0


def _ask_again(path: str) -> dict[str, Any] | None:
    try:
        return request(path, "status")
    except (ControlError, OSError) as e:
        reason = "" if isinstance(e, (FileNotFoundError, ConnectionRefusedError)) else f" ({printable(e)})"
        print(f"refork: the monitor at {path} went away{reason}", file=sys.stderr)
        return None


def watch_frame(answer: dict[str, Any], interval: float, before: tuple[float, dict[str, Any]] | None) -> str:
    """One refresh: a clock line, the status table and a totals line (with req/s since the last)."""
    when = time.strftime("%H:%M:%S")
    return "\n".join(
        (
            f"refork status, every {interval:g}s, {when} (Ctrl-C to quit)",
            format_status(answer),
            format_totals(answer, before),
        )
    )


def format_totals(status: dict[str, Any], before: tuple[float, dict[str, Any]] | None = None) -> str:
    """Sums over all processes; the request rate since `before` = (seconds ago, earlier answer)."""
    procs = status["processes"]
    workers = [p for p in procs if p["role"] != "mold"]
    requests = sum(int(p["requests"]) for p in workers)
    websockets = sum(int(p.get("websockets", 0)) for p in workers)
    http2 = sum(int(p.get("http2", 0)) for p in workers)

    def total(key: str) -> str:
        return format_bytes(sum(int(p[key] or 0) for p in procs))

    rate = ""
    if before is not None and before[0] > 0:
        # Per worker pid, so a replaced worker's count restarting at 0 does not go negative.
        earlier = {p["pid"]: int(p["requests"]) for p in before[1]["processes"]}
        served = sum(max(0, int(p["requests"]) - earlier.get(p["pid"], 0)) for p in workers)
        rate = f" ({served / before[0]:.1f} req/s)"
    return printable(
        f"total: {len(workers)} workers  requests {requests}{rate}  "
        + (f"websockets {websockets}  " if websockets else "")
        + (f"http2 connections {http2}  " if http2 else "")
        + f"RSS {total('rss')}  PSS {total('pss')}  USS {total('uss')}"
    )


PRIVATE_HEAVY = 0.5  # a worker whose own memory is this share of its resident memory gets a note
KEEPS_PER_REQUEST = 512  # bytes of its own gained per request that mean the app keeps memory


def memory_note(p: dict[str, Any]) -> str:
    """Why a worker holds much memory of its own, so its owner can tune the refork policy: copied
    since its fork (a refork shares it again) or gained with every request (the app keeps it)."""
    rss, uss = p.get("rss"), p.get("uss")
    if p["role"] != "worker" or not rss or uss is None or uss < PRIVATE_HEAVY * rss:
        return ""
    own = f"{uss / rss:.0%} of its memory is its own"
    growth = p.get("private_per_request")
    if growth is not None and growth >= KEEPS_PER_REQUEST:
        return (f"{own}, +{format_bytes(int(growth))} a request: the app keeps memory per request "
                "(--max-requests, --max-worker-memory)")  # fmt: skip
    return (f"{own}, copied since its fork ({p['requests']} requests): a refork shares what is warm "
            "(--refork-after, `refork refork`)")  # fmt: skip


def format_status(status: dict[str, Any]) -> str:
    def size(value: int | None) -> str:
        return "-" if value is None else format_bytes(value)

    header = (
        "PID", "ROLE", "GEN", "STATE", "REQS", "WS", "H2", "RSS", "PSS", "USS", "SHARED", "PRIV_DIRTY",
        "MINFLT", "NOTE",
    )  # fmt: skip
    rows: list[tuple[str, ...]] = [header]
    for p in status["processes"]:
        role = p["role"] if p["role"] == "mold" else f"worker {p['nr']}"
        note = p.get("fork_unsafe") and f"fork-unsafe: {p['fork_unsafe']}" or p.get("retiring") or ""
        if p.get("overdue"):
            note = f"{p['overdue']} hung (past --request-timeout)" + (f"; {note}" if note else "")
        memory = memory_note(p)
        if memory:
            note = f"{note}; {memory}" if note else memory
        rows.append(
            (
                str(p["pid"]),
                role,
                str(p["generation"]),
                p["state"],
                str(p["requests"]),
                str(p.get("websockets", 0)) if p["role"] != "mold" else "-",
                str(p.get("http2", 0)) if p["role"] != "mold" else "-",
                size(p["rss"]),
                size(p["pss"]),
                size(p["uss"]),
                size(p.get("shared")),
                size(p["private_dirty"]),
                "-" if p["minflt"] is None else str(p["minflt"]),
                note,
            )
        )
    rows = [tuple(printable(cell) for cell in row) for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    where = ", ".join(status.get("bind", [])) or "?"
    lines = [
        printable(f"server {status.get('app', '?')} on {where} (monitor {status['monitor_pid']})"),
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
