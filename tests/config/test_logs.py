"""Error log setup and the access log formats, plus reopen for logrotate."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil

import pytest

from refork.config import Config
from refork.http.events import Request
from refork.logs import AccessLog, reopen_log_files, setup_logging

HEADERS = [(b"host", b"a"), (b"referer", b"http://r/"), (b"user-agent", b'curl/8 "q"')]
REQUEST = Request("GET", b"/x?y=1", b"/x", b"y=1", "1.1", HEADERS)
LINE = (REQUEST, "127.0.0.1", 200, 5, 0.0123)


def lines(path):
    return path.read_text().splitlines()


def test_from_config_off():
    assert AccessLog.from_config(Config()) is None


def test_default_is_gunicorns(tmp_path):
    log = AccessLog.from_config(Config(access_logfile=str(tmp_path / "a.log")))
    log.write(*LINE)
    (line,) = lines(tmp_path / "a.log")
    assert line.endswith('"GET /x?y=1 HTTP/1.1" 200 5 "http://r/" "curl/8 \\"q\\""')
    log.close()


def test_common(tmp_path):
    log = AccessLog(str(tmp_path / "a.log"), "common")
    log.write(*LINE)
    log.write(REQUEST, "127.0.0.1", 304, 0, 0.0)
    (first, second) = lines(tmp_path / "a.log")
    stamp = r"\[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]"
    assert re.fullmatch(rf'127\.0\.0\.1 - - {stamp} "GET /x\?y=1 HTTP/1\.1" 200 5', first)
    assert second.endswith('" 304 -')
    log.close()


def test_combined_escapes(tmp_path):
    log = AccessLog(str(tmp_path / "a.log"), "combined")
    log.write(*LINE)
    log.write(Request("GET", b'/evil\n"x', b'/evil\n"x', b"", "1.1"), "127.0.0.1", 200, 5, 0.0)
    first, second = lines(tmp_path / "a.log")
    assert first.endswith('"GET /x?y=1 HTTP/1.1" 200 5 "http://r/" "curl/8 \\"q\\""')
    assert second.endswith('"GET /evil\\x0a\\"x HTTP/1.1" 200 5 "-" "-"')
    log.close()


def test_json(tmp_path):
    log = AccessLog(str(tmp_path / "a.log"), "json")
    log.write(*LINE)
    (line,) = lines(tmp_path / "a.log")
    record = json.loads(line)
    assert record["remote"] == "127.0.0.1" and record["method"] == "GET"
    assert (record["path"], record["query"], record["proto"]) == ("/x", "y=1", "HTTP/1.1")
    assert (record["status"], record["bytes"], record["duration_ms"]) == (200, 5, 12.3)
    assert record["referer"] == "http://r/" and record["user_agent"] == 'curl/8 "q"'
    assert record["pid"] == os.getpid() and record["ts"].endswith("Z")
    log.close()


def test_reopen(tmp_path):
    path = tmp_path / "a.log"
    log = AccessLog(str(path), "common")
    log.write(*LINE)
    os.rename(path, tmp_path / "a.log.1")
    log.write(*LINE)
    reopen_log_files()
    log.write(*LINE)
    assert len(lines(tmp_path / "a.log.1")) == 2
    assert len(lines(path)) == 1
    log.reopen()
    log.write(*LINE)
    assert len(lines(path)) == 2
    log.close()


def test_stdout(capsys):
    log = AccessLog("-")
    log.write(*LINE)
    log.reopen()
    assert capsys.readouterr().out.startswith("127.0.0.1 - - [")


@pytest.fixture
def restore_refork_logger():
    logger = logging.getLogger("refork")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    for h in list(logger.handlers):
        logger.removeHandler(h)
        h.close()
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_error_log_file_and_reopen(tmp_path, restore_refork_logger):
    path = tmp_path / "error.log"
    logger = setup_logging(Config(error_logfile=str(path), log_level="warning"))
    logger.info("hidden")
    logger.warning("first")
    os.rename(path, tmp_path / "error.log.1")
    reopen_log_files()
    logger.error("second")
    (old,) = lines(tmp_path / "error.log.1")
    (new,) = lines(path)
    assert re.fullmatch(rf"\[.+\] \[{os.getpid()}\] \[WARNING\] first", old)
    assert new.endswith("[ERROR] second")


def test_error_log_stderr(capsys, restore_refork_logger):
    logger = setup_logging(Config(log_level="debug"))
    setup_logging(Config(log_level="debug"))  # idempotent: still one handler
    logger.debug("hello")
    assert capsys.readouterr().err.count("[DEBUG] hello") == 1


def test_access_log_on_a_full_disk_tells_once():
    log = AccessLog("/dev/full")  # every write: ENOSPC
    told = []
    log.lost.tell = told.append
    for _ in range(100):
        log.write(*LINE)
    assert log.lost.total == 100
    (one,) = told
    assert one == ("access log /dev/full: 1 line(s) lost (ENOSPC: No space left on device); "
                   "told at most every 10 s")
    log.reopen()
    log.close()


def test_reopen_keeps_the_file_when_its_directory_is_gone(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    log = AccessLog(str(folder / "a.log"), "common")
    shutil.rmtree(folder)
    log.reopen()  # one warning; writes go on to the deleted file
    log.write(*LINE)
    assert log.lost.total == 0
    folder.mkdir()
    log.reopen()
    log.write(*LINE)
    assert len(lines(folder / "a.log")) == 1
    log.close()


def test_error_log_on_a_full_disk_tells_stderr_once(capfd, restore_refork_logger):
    logger = setup_logging(Config(error_logfile="/dev/full"))
    for i in range(50):
        logger.warning("line %d", i)
    reopen_log_files()  # the old stream's unwritten lines are dropped, not raised
    logger.warning("after the reopen")
    (told,) = capfd.readouterr().err.splitlines()
    assert told.endswith("[WARNING] error log /dev/full: 1 line(s) lost (ENOSPC: No space left on device); "
                         "told at most every 10 s")  # fmt: skip
