"""The target page's "Processes" table in real headless Chromium: a family's members by role with their shares
(/api/members), hostile process titles as text, and "not measured" where a role measured nothing."""

from __future__ import annotations

import random
import time

import pytest

from agent.metrics import build_registry
from agent.state import AgentState
from agent.store import Store
from analysis.snapshot import TargetStatus
from analysis.window import MemberReading
from dashboards.app import create_app
from tests.dashboards.browser import chromium, console_errors, screenshot, serve, wait_for
from tests.dashboards.synthetic import HOSTILE, window

pytestmark = pytest.mark.browser


def _family_store(directory, now: float):
    store = Store.open(directory)
    rng = random.Random(2)
    for i in range(60):
        start = now - (60 - i) * 5.0
        w = window("vllm", start, 5.0, False, rng)
        w.members = [MemberReading(pid=10, role="vllm serve", cpu_seconds=1.0, offcpu_seconds=4.0, rss_bytes=200 << 20),
                     MemberReading(pid=11, role="VLLM::EngineCore", cpu_seconds=3.0, offcpu_seconds=1.0,
                                   gc_pause_seconds=0.2, rss_bytes=900 << 20),
                     MemberReading(pid=12, role=HOSTILE, errors={"process": "cannot read pid 12: denied"})]
        store.add_window(w)
    return store


def test_the_target_page_lists_a_familys_processes_with_their_shares(tmp_path):
    now = time.time()
    store = _family_store(tmp_path / "store", now)
    state = AgentState()
    state.set_target(TargetStatus(name="vllm", pid=10, state="watching", since=now - 300))
    app = create_app({"STATE": state, "STORE": store, "REGISTRY": build_registry(state), "INTERVAL_SECONDS": 5.0})
    try:
        with serve(app) as url, chromium(tmp_path) as b:
            b.get(url + "/targets/vllm")
            rows = wait_for(b, """const rows = [...document.querySelectorAll('#members tr[data-role]')];
                return rows.length === 3 ? rows.map(r => [...r.cells].map(c => c.textContent)) : null""",
                            what="three process rows")
            by_role = {r[0]: r for r in rows}
            assert by_role["VLLM::EngineCore"][1:5] == ["11", "75 %", "20 %", "100 %"]
            assert by_role["vllm serve"][1:5] == ["10", "25 %", "80 %", "not measured"]  # it ran no GC probe: never 0
            hostile = by_role[HOSTILE]  # the title arrives as text, never as markup
            assert hostile[2] == "not measured" and "cannot read pid 12" in hostile[6]
            assert b.execute_script("return window.__xss === undefined")
            screenshot(b, "target-members")
            assert console_errors(b) == []
    finally:
        store.close()
