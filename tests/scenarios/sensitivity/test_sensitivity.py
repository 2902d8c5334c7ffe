"""The hog-strength recordings replay to what docs/BENCHMARKS.md reports ("Detector": hog strength), phase by
phase (docs/BENCHMARKS.md, "How strong must an outside hog be?"). They are evidence for the sensitivity floor,
not part of the suite the issue's bounds apply to."""

from pathlib import Path

import pytest

from analysis.scenario import load_scenario
from tests.scenarios.sensitivity.phase_table import rows

HERE = Path(__file__).resolve().parent
# recording -> for each hog phase (1-based index in its scenario): detected?
EXPECTED = {
    "strength-quiet.jsonl.gz": {2: True, 4: True, 6: True, 8: True},
    "strength-neighbours.jsonl.gz": {2: True, 4: False, 6: False, 8: True},
    "priority-neighbours.jsonl.gz": {2: False, 4: False, 6: False, 8: False},
}


def test_the_sensitivity_scenarios_load_and_stay_out_of_the_suite():
    names = {load_scenario(p).name for p in HERE.glob("*.toml")}
    assert names == {"outside hog strength", "outside hog priority"}
    assert not any(p.name.startswith("hog_") for p in HERE.parent.glob("*.toml"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_hog_phase_replays_as_documented(name):
    found = rows(HERE / "recorded" / name)
    assert {r["phase"]: r["detected"] for r in found} == EXPECTED[name]
    # Whatever is found is named for what it is, and the hog never lowered the server's latency.
    assert all(r["top_cause"] == "cpu_contention" for r in found if r["detected"])
    assert all(r["latency_ratio"] > 1.09 for r in found), found
