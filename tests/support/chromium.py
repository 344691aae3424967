"""Headless Chromium (Debian's `chromium`, installed by ./scripts/test) driving a test page."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

FLAGS = ["--headless=new", "--no-sandbox",  # root in a container
         "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
         "--disable-extensions", "--disable-background-networking"]  # fmt: skip


def run_page(url: str, report: Path, *flags: str, timeout: float = 45.0) -> tuple[int | None, str]:
    """Load `url` until the page has written `report` (or the browser exits, or `timeout`), then kill
    the browser with its helper processes: (its exit status, the end of its log)."""
    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is needed (./scripts/test installs it)"
    with tempfile.TemporaryDirectory(prefix="refork-chromium-") as profile:
        log_path = Path(profile) / "chromium.log"
        with open(log_path, "wb") as log:
            command = [chromium, *FLAGS, *flags, f"--user-data-dir={profile}", url]
            browser = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                deadline = time.monotonic() + timeout
                while not report.exists() and time.monotonic() < deadline and browser.poll() is None:
                    time.sleep(0.05)
            finally:
                try:
                    os.killpg(browser.pid, signal.SIGKILL)  # its own process group: every helper
                except ProcessLookupError:
                    pass
                browser.wait(10)
        return browser.returncode, log_path.read_text(errors="replace")[-3000:]
