"""The status page as a person sees it: served by waitress, rendered by real headless Chromium."""

import shutil
import socket
import subprocess
import threading
from html.parser import HTMLParser

import pytest
from waitress.server import create_server

pytestmark = pytest.mark.browser

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


class _Rendered(HTMLParser):
    """The parts of the rendered DOM a person reads: source rows (class + cells) and window figures."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self.figures: dict[str, str] = {}
        self.errors: list[str] = []
        self._tag: str | None = None
        self._in_sources = False
        self._term: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        if tag == "table":
            self._in_sources = attr.get("id") == "sources"
        elif tag == "tr" and self._in_sources:
            self.rows.append((attr.get("class") or "", []))
        if not (tag == "span" and self._tag == "dd"):  # a figure's own markup ("not measured") is its text
            self._tag = tag

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._in_sources = False
        if tag != "span":
            self._tag = None

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if self._tag == "td" and self._in_sources and self.rows:
            self.rows[-1][1].append(text)
        elif self._tag == "dt":
            self._term = text
        elif self._tag == "dd" and self._term:
            self.figures[self._term] = self.figures.get(self._term, "") + text
        elif self._tag == "li":
            self.errors.append(text)


def test_chromium_shows_states_reasons_and_null_readings(served, tmp_path):
    proc = subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                           "--window-size=1200,900", "--dump-dom", f"{served}/"],
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = _Rendered()
    page.feed(proc.stdout)
    rows = {cells[0]: (cls, cells) for cls, cells in page.rows if cells}
    assert rows["gc"][0] == "state-unsupported" and rows["gc"][1][1] == "unsupported"
    assert rows["syscalls"][0] == "state-running" and rows["syscalls"][1][1] == "running"
    # Readings the window lacks say "not measured" (the GPU line its own reason, or a dash), never a zero; the
    # ones it has show their value.
    assert page.figures["Python samples"] == "not measured" and page.figures["GPU"] == "–"
    assert page.figures["TCP retransmits"] == "2" and page.figures["GC"].startswith("3 collections")
    # The server renders the window's errors; the overview script may add the same line again before the dump.
    assert set(page.errors) == {"stacks: py-spy exited: boom"}
