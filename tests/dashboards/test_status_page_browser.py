"""The status page as a person sees it: served by waitress, rendered by real headless Chromium."""

import shutil
import socket
import subprocess
import threading

import pytest
from waitress.server import create_server

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is missing: 'make setup' installs the Debian package")
    return path


@pytest.fixture
def served(app):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server(app, host="127.0.0.1", port=port, threads=2)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.close()
    thread.join(timeout=5)


def test_chromium_renders_targets_sources_and_window(served, tmp_path):
    proc = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--dump-dom", f"{served}/"], capture_output=True, text=True, timeout=90)
    dom = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '<table id="targets">' in dom and "4242" in dom
    assert '<table id="sources">' in dom and "no gc_collect_main" in dom
    assert "50.0 / 120.0 ms" in dom


def test_chromium_screenshot_is_a_png(served, tmp_path):
    shot = tmp_path / "status.png"
    proc = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           f"--screenshot={shot}", "--window-size=1200,900", f"{served}/"],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
