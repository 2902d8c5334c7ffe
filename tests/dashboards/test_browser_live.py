"""The page over the real agent (`infersight run`) in real headless Chromium: a process with hostile strings in
its command line and function names is watched and nothing executes; a workload fault brings the banner live."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.dashboards.browser import chromium, console_errors, screenshot, wait_for
from tests.live import free_port, start_server, terminate, wait_http, workload_target, write_agent_config

pytestmark = pytest.mark.browser

XSS_ARG = '<script>window.__xss=1</script>"onerror="window.__xss=2'
XSS_FUNC = '<img src=x onerror="window.__xss=3">'
XSS_FILE = '"><svg onload="window.__xss=4">.py'

# A busy Python process whose argv, function name and file name are all markup; py-spy reads the latter two
# from the interpreter's memory, so they reach the store, the flame graph JSON and the page as they are.
HOSTILE_PROGRAM = textwrap.dedent(f"""
    import time
    def spin():
        end = time.time() + 0.05
        while time.time() < end:
            pass
    spin.__code__ = spin.__code__.replace(co_name={XSS_FUNC!r}, co_qualname={XSS_FUNC!r},
                                          co_filename={XSS_FILE!r})
    deadline = time.time() + 300
    while time.time() < deadline:
        spin()
        time.sleep(0.01)
""")


def agent_config(tmp: Path, port: int, targets: str, warmup: int = 8) -> Path:
    path = write_agent_config(tmp, port, f"""
        [stacks]
        rate_hz = 49
        [detector]
        warmup_windows = {warmup}
    """, targets, interval=1)
    os.chmod(tmp, 0o700)
    return path


def no_xss(browser) -> None:
    assert browser.execute_script("return window.__xss === undefined"), "a hostile string executed"
    found = browser.execute_script(
        "return document.querySelectorAll('img[src=\"x\"], svg[onload], b[onmouseover], script:not([src])').length")
    assert found == 0, "hostile markup became elements"


@pytest.mark.slow
@pytest.mark.bpf
def test_hostile_process_is_watched_and_nothing_executes(require_bpf, tmp_path):
    tag = f"xss-{uuid.uuid4().hex[:10]}"
    port = free_port()
    config = agent_config(tmp_path, port, f"""
        [[targets]]
        name = "hostile"
        process_regex = "{tag}"
    """)
    log = open(tmp_path / "processes.log", "w")
    hostile = agent = None
    try:
        program = tmp_path / '"><b onmouseover="window.__xss=5">' / "spin.py"
        program.parent.mkdir()
        program.write_text(HOSTILE_PROGRAM)
        hostile = subprocess.Popen([sys.executable, str(program), tag, XSS_ARG], stdout=log, stderr=log)
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                 stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/api/status", 60)
        # Wait until py-spy's samples of the renamed function are stored.
        deadline = time.monotonic() + 60
        tree = {}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/api/flamegraph/tree?target=hostile&kind=active", timeout=10) as r:
                    tree = json.load(r)
            except urllib.error.HTTPError:
                tree = {}
            if "window.__xss=3" in json.dumps(tree):
                break
            time.sleep(1)
        assert "window.__xss=3" in json.dumps(tree), ("the renamed function never reached the store",
                                              (tmp_path / "processes.log").read_text()[-2000:])
        with chromium(tmp_path) as b:
            pages = {
                "overview": ("/", "return document.querySelectorAll('#target-cards .card').length > 0"),
                "target": ("/targets/hostile", "return !!document.getElementById('target').dataset.loaded"),
                "flamegraph": ("/flamegraph?target=hostile&minutes=5",
                               "return document.getElementById('flame').dataset.drawn === '1'"),
            }
            console_errors(b)
            for name, (path, ready) in pages.items():
                b.get(url + path)
                wait_for(b, ready, what=f"{name} drawn")
                time.sleep(1.0)
                screenshot(b, f"hostile-{name}")
                assert console_errors(b) == [], name
                no_xss(b)
            # The strings are on the page, as text.
            b.get(url + "/")
            wait_for(b, pages["overview"][1])
            assert XSS_ARG in b.find_element(By.ID, "target-cards").text
            b.get(url + pages["flamegraph"][0])
            wait_for(b, pages["flamegraph"][1])
            titles = b.execute_script("return [...document.querySelectorAll('#flame title')].map(t => t.textContent)")
            assert any(XSS_FUNC in t for t in titles), titles[:10]
            b.find_element(By.ID, "flame-search").send_keys("img src")
            time.sleep(1.0)
            no_xss(b)
            assert console_errors(b) == []
    finally:
        for proc in (agent, hostile):
            terminate(proc)
        log.close()


@pytest.mark.slow
@pytest.mark.bpf
@pytest.mark.workload
def test_workload_fault_brings_the_banner_without_a_reload(require_bpf, tmp_path):
    tag = f"fault-{uuid.uuid4().hex[:10]}"
    port, agent_port = free_port(), free_port()
    config = agent_config(tmp_path, agent_port, workload_target(tag, port, timeout_seconds=10), warmup=30)
    log = open(tmp_path / "processes.log", "w")
    server = load = agent = None
    try:
        server = start_server(port, tag, log)
        load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", f"http://127.0.0.1:{port}",
                                 "--rate", "4", "--duration", "400", "--no-progress"], stdout=log, stderr=log)
        agent = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
                                 stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{agent_port}"
        wait_http(f"{url}/api/status", 60)
        with chromium(tmp_path) as b:
            b.get(url + "/")
            # Warm-up over: the detector is armed, and no regression is open.
            # Armed means judged healthy after warm-up: before its first window the detector has no state
            # at all, and a fault switched on then would become part of the baseline it learns.
            wait_for(b, """return document.querySelector('#regressions .no-regression') &&
                document.querySelector('#regressions').textContent.includes('workload: healthy')""", timeout=180,
                     what="the detector armed")
            b.execute_script("window.__sameDocument = true")
            switch = urllib.request.Request(f"http://127.0.0.1:{port}/admin/faults", method="POST",
                                            data=json.dumps({"name": "gc", "on": True}).encode(),
                                            headers={"Authorization": f"Bearer {tag}",
                                                     "Content-Type": "application/json"})
            urllib.request.urlopen(switch, timeout=10).close()
            wait_for(b, "return document.querySelector('#regressions .banner')", timeout=180, what="the banner")
            assert b.execute_script("return window.__sameDocument === true"), "the page reloaded"
            assert "Latency regression on workload" in b.find_element(By.ID, "regressions").text
            screenshot(b, "live-fault-banner")
            assert console_errors(b) == []
    finally:
        for proc in (agent, load, server):
            terminate(proc)
        log.close()
