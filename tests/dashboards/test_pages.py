"""The target page opens at the smallest preset range that holds the stored windows (1h with none, or older
than the longest preset); ?range= in the address still wins (target.js)."""

from __future__ import annotations

import re
import time

import pytest

from dashboards.app import create_app
from dashboards.pages import default_range
from tests.dashboards.synthetic import fill

NOW = 1_800_000_000.0


@pytest.mark.parametrize(("age", "expected"), [
    (60, "15m"), (900, "15m"), (901, "1h"), (3600, "1h"), (3 * 3600, "6h"), (86400, "24h"), (2 * 86400, "7d"),
    (7 * 86400, "7d"), (7 * 86400 + 1, "1h")])
def test_default_range_is_the_smallest_that_holds_the_data(age: float, expected: str) -> None:
    assert default_range(NOW - age, NOW) == expected


def test_no_stored_window_opens_at_one_hour() -> None:
    assert default_range(None, NOW) == "1h"


@pytest.mark.parametrize(("seconds", "expected"), [(300, "15m"), (2 * 3600, "6h")])
def test_the_page_carries_the_range_of_its_targets_data(tmp_path, seconds: float, expected: str) -> None:
    store = fill(tmp_path / "store", time.time(), seconds)
    try:
        client = create_app({"STORE": store}).test_client()
        for target, want in (("server", expected), ("nothing-stored", "1h")):
            html = client.get(f"/targets/{target}").get_data(as_text=True)
            assert re.search(r'<section id="target"[^>]* data-range="([^"]+)"', html).group(1) == want
    finally:
        store.close()
