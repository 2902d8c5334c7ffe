"""The target page's changes in real headless Chromium: a Δ line on the charts, the diff listed as text (hostile text
never runs), and the before/after report on click."""

from __future__ import annotations

import dataclasses
import time

import pytest
from selenium.webdriver.common.by import By

from agent.store import Store, StoredChange
from analysis.regression import Cause, Regression
from dashboards.app import create_app
from tests.analysis.test_change_report import _windows
from tests.dashboards.browser import chromium, console_errors, serve, wait_for
from tests.dashboards.synthetic import HOSTILE

pytestmark = pytest.mark.browser


def test_change_marker_diff_and_report(tmp_path):
    now = time.time()
    at = now - 1000
    with Store.open(tmp_path / "store") as store:
        for w in _windows(150, at - 750, latency=0.05):
            store.add_window(w)
        for w in _windows(190, at + 5, latency=0.09, seed=1):
            store.add_window(dataclasses.replace(w, pid=2))
        change = StoredChange(id=f"srv-change-{at:.3f}", target="srv", at=at, pid=2, before={}, after={},
                              diff=[{"part": "cmdline", "before": "serve --max-batch 8", "after": f"serve {HOSTILE}"}])
        store.settle_identity("srv", 2, 1, at, {}, change)
        store.save_regression(Regression(id="srv-regression", target="srv", pid=2, opened_at=at + 20, severity="warning",
                                         score=6.0, causes=[Cause("change", 4.0, f"began after a change: {HOSTILE}")],
                                         change_id=change.id))
        app = create_app({"STATE": None, "STORE": store, "INTERVAL_SECONDS": 5.0})
        with serve(app) as url, chromium(tmp_path) as b:
            b.get(url + "/targets/srv?range=1h")
            wait_for(b, "return document.querySelectorAll('#target-changes li[data-change]').length === 1",
                     what="the change listed")
            item = b.find_element(By.CSS_SELECTOR, "#target-changes li[data-change]")
            assert f"serve {HOSTILE}" in item.text and "cmdline" in item.text
            wait_for(b, "return (window.infersightCharts || []).length > 0", what="charts")
            greys = b.execute_script("""
                // The TCP chart: no reading, no series line, so the column at the change holds the marker alone.
                const u = window.infersightCharts.find((c) => c.root.closest("#chart-tcp"));
                const at = Math.round(u.valToPos(arguments[0], 'x', true));
                const share = (x) => {
                  const px = u.ctx.getImageData(x, Math.round(u.bbox.top), 1, Math.round(u.bbox.height)).data;
                  let grey = 0;
                  for (let i = 0; i < px.length; i += 4) {
                    const [r, g, b, a] = [px[i], px[i + 1], px[i + 2], px[i + 3]];
                    if (a > 0 && r < 200 && Math.abs(r - g) < 12 && Math.abs(g - b) < 12) grey++;
                  }
                  return grey / (px.length / 4);
                };
                return [Math.max(share(at - 1), share(at), share(at + 1)), share(at + 40)];""", at)
            # A dashed grey line down the column of the change; a little to its right only the grid's greys.
            assert greys[0] > 0.3 and greys[0] > 4 * greys[1], greys
            item.find_element(By.CSS_SELECTOR, "button.change-report-button").click()
            wait_for(b, "return document.querySelectorAll('table.change-report tr').length === 8", what="report")
            report = b.find_element(By.CSS_SELECTOR, "#target-changes .change-report-box").text
            assert "p99_at_equal_load" in report and "verdict: regression" in report
            time.sleep(6)  # a refresh of the page's data: the report stays open
            assert b.find_elements(By.CSS_SELECTOR, "table.change-report")
            assert b.execute_script("return window.__xss === undefined")
            assert not [e for e in console_errors(b) if e["level"] == "SEVERE"]
            # The regression that followed it names the change and leads back to the target page.
            b.get(url + "/regressions/srv-regression")
            wait_for(b, "return document.querySelector('#regression-detail p.change') !== null", what="change line")
            line = b.find_element(By.CSS_SELECTOR, "#regression-detail p.change")
            assert change.id in line.text
            assert line.find_element(By.TAG_NAME, "a").get_attribute("href").endswith("/targets/srv")
