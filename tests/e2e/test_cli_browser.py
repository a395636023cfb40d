"""The browser tab `tether serve` opens at start (unless --no-browser): it must reach the
server, whatever --host and --port say (docs/configuration.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("host", "shown"), [("127.0.0.1", "127.0.0.1"), ("::1", "[::1]"), ("0.0.0.0", "127.0.0.1")]
)
def test_the_browser_opens_an_address_the_server_answers_on(
    tmp_path: Path, host: str, shown: str
) -> None:
    """It opened http://{--host}:{--port}/ as written: port 0 gave `:0`, an IPv6 address lost
    its brackets, and 0.0.0.0 is no address to connect to."""
    opened = tmp_path / "opened"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\necho "$1" > {opened}.part && mv {opened}.part {opened}\n')
    browser.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "serve", "--host", host, "--port", "0"]
        + ["--data-dir", str(tmp_path / "data"), "--insecure-no-password"],
        env={**os.environ, "BROWSER": str(browser)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(400):
            if opened.exists() or proc.poll() is not None:
                break
            threading.Event().wait(0.05)
        url = opened.read_text().strip()
        assert re.fullmatch(rf"http://{re.escape(shown)}:[1-9]\d*/", url), url
        assert httpx.get(url + "api/health", timeout=5).json()["ok"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
