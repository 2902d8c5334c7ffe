"""Real headless Chromium through selenium (Debian chromium + chromium-driver), and a waitress server for an app."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from waitress.server import create_server

REPO = Path(__file__).resolve().parents[2]
# Screenshots outlive the run here (build/ is git-ignored); INFERSIGHT_SCREENSHOTS moves them.
SCREENSHOTS = Path(os.environ.get("INFERSIGHT_SCREENSHOTS", REPO / "build" / "screenshots"))


@contextmanager
def serve(app) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server(app, host="127.0.0.1", port=port, threads=4)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        thread.join(timeout=5)


@contextmanager
def chromium(tmp: Path) -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.fail("chromium or chromedriver is missing: 'make setup' installs chromium and chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1000", f"--user-data-dir={tmp / 'chromium-profile'}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(options=opts, service=Service(executable_path=driver))
    browser.set_page_load_timeout(60)
    try:
        yield browser
    finally:
        browser.quit()


def console_errors(browser) -> list[dict]:
    """Console messages at error level since the last call (CSP refusals and uncaught exceptions included)."""
    return [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def wait_for(browser, script: str, timeout: float = 30.0, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = browser.execute_script(script)
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or script}; "
                         f"console: {browser.get_log('browser')[-5:]}")


def screenshot(browser, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    browser.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return path


Clock = Callable[[], float]
