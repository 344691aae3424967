"""`refork status --watch`: live tables from a real server, Ctrl-C exits 0, a vanished server exits 1."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time

from conftest import ROOT, run_cli

from refork.status import format_totals, watch_frame

HEADER = "refork status, every 0.2s"


def ignore_sigint() -> None:
    """As under nohup or a CI runner that ignores SIGINT: the watch inherits SIG_IGN, and Ctrl-C
    must stop it all the same (whatever the test runner itself inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def watch_proc(control: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "refork", "status", "--control-socket", control, "--watch", "0.2", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint,
    )


def read_until(fd: int, predicate, timeout: float = 20.0) -> bytes:
    """Bytes from fd until predicate(all so far) holds; fails on timeout or EOF."""
    data = b""
    deadline = time.monotonic() + timeout
    while not predicate(data):
        left = deadline - time.monotonic()
        assert left > 0, f"timed out; got {data!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the pty's other side closed
                chunk = b""
            assert chunk, f"EOF; got {data!r}"
            data += chunk
    return data


def test_watch_prints_successive_tables_and_exits_0_on_sigint_even_if_it_inherited_it_ignored(start_server):
    server = start_server(workers=2)
    for _ in range(5):
        server.get("/")
    proc = watch_proc(server.control)
    try:
        assert proc.stdout is not None
        out = read_until(proc.stdout.fileno(), lambda d: d.count(HEADER.encode()) >= 3).decode()
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    out += rest
    assert "\x1b" not in out  # not a terminal: plain tables, no escape sequences
    frames = [f for f in out.split(HEADER) if f.strip()]
    assert len(frames) >= 3
    for frame in frames[:3]:
        assert "PID" in frame and "RSS" in frame and "PSS" in frame and "USS" in frame
        assert frame.count("worker ") == 2 and "mold" in frame
        assert "total: 2 workers  requests 5" in frame
    assert "req/s" not in frames[0] and "req/s" in frames[1]  # a rate needs two answers


def test_watch_ends_with_one_line_and_exit_1_when_the_server_goes_away(start_server):
    server = start_server(workers=1)
    proc = watch_proc(server.control)
    try:
        assert proc.stdout is not None
        read_until(proc.stdout.fileno(), lambda d: HEADER.encode() in d)
        server.stop()
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert err.strip().count("\n") == 0 and "went away" in err, err


def test_watch_without_a_server_is_the_usual_error(tmp_path):
    result = run_cli("status", "--control-socket", str(tmp_path / "nobody.ctl"), "--watch", "0.2", timeout=15)
    assert result.returncode == 2
    assert "no refork monitor" in result.stderr and "Traceback" not in result.stderr


def test_watch_argument_errors(tmp_path):
    sock = str(tmp_path / "x.ctl")
    for args in (("--watch", "0"), ("--watch", "soon"), ("--watch", "nan")):
        result = run_cli("status", "--control-socket", sock, *args)
        assert result.returncode == 2 and "--watch" in result.stderr, result.stderr
    for args in (("reload", "--watch", "1"), ("status", "--json", "--watch", "1")):
        result = run_cli(args[0], "--control-socket", sock, *args[1:])
        assert result.returncode == 2 and "--watch goes with" in result.stderr, result.stderr


def test_watch_on_a_terminal_redraws_in_place(start_server):
    server = start_server(workers=1)
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "refork", "status", "--control-socket", server.control, "--watch", "0.2"],
        cwd=ROOT,
        stdin=child,
        stdout=child,
        stderr=child,
        start_new_session=True,
        preexec_fn=ignore_sigint,
    )
    os.close(child)
    try:
        out = read_until(main, lambda d: d.count(b"\x1b[H") >= 2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        try:
            while select.select([main], [], [], 0.5)[0] and (chunk := os.read(main, 65536)):
                out += chunk
        except OSError:  # EIO once the child side is gone
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    text = out.decode(errors="replace")
    assert text.startswith("\x1b[H\x1b[2J")  # the first frame clears the screen once
    assert text.count("\x1b[2J") == 1  # later frames go home and overwrite: no flicker
    assert "\x1b[K" in text and "\x1b[J" in text
    assert "Traceback" not in text


def test_totals_and_rate_with_a_replaced_worker():
    def answer(*workers: tuple[int, int]) -> dict:
        procs = [{"pid": 1, "role": "mold", "nr": -1, "generation": 0, "state": "ready", "requests": 0,
                  "rss": 10 << 20, "pss": 5 << 20, "uss": 1 << 20, "private_dirty": 0, "minflt": 0}]
        procs += [{"pid": pid, "role": "worker", "nr": i, "generation": 0, "state": "ready", "requests": reqs,
                   "rss": 20 << 20, "pss": 8 << 20, "uss": 2 << 20, "private_dirty": 0, "minflt": 0}
                  for i, (pid, reqs) in enumerate(workers)]
        return {"monitor_pid": 9, "generation": 0, "workers": len(workers), "allocator": "glibc",
                "total_pss": 0, "processes": procs}

    before = answer((10, 100), (11, 50))
    after = answer((10, 130), (12, 20))  # worker 11 replaced by 12, whose count starts again
    line = format_totals(after, (2.0, before))
    assert line == "total: 2 workers  requests 150 (25.0 req/s)  RSS 50.0M  PSS 21.0M  USS 5.0M"
    evil = answer((10, 1))
    evil["processes"][1]["state"] = "\x1b[31mred"
    assert "\x1b" not in watch_frame(evil, 1.0, None)


def test_a_worker_holding_mostly_its_own_memory_gets_a_note_saying_why():
    from refork.status import memory_note

    row = {"role": "worker", "rss": 100 << 20, "uss": 70 << 20, "requests": 5000}
    assert memory_note({**row, "private_per_request": None}).startswith(
        "70% of its memory is its own, copied since its fork (5000 requests): a refork shares"
    )
    assert memory_note({**row, "private_per_request": 20_000.0}).startswith(
        "70% of its memory is its own, +19.5K a request: the app keeps memory per request"
    )
    assert memory_note({**row, "uss": 30 << 20, "private_per_request": 20_000.0}) == ""  # mostly shared
    assert memory_note({**row, "role": "mold", "private_per_request": None}) == ""
