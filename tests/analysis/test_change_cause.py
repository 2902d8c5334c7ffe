"""analysis.change_cause: when a regression is put down to a change, and how it reads."""

from __future__ import annotations

import pytest

from analysis.change_cause import ChangeNote, attribute_change
from analysis.regression import Cause, Grower, Regression, regression_from_dict, regression_to_dict

CHANGE = ChangeNote(id="srv-change-1000.000", at=1000.0,
                    diff=("cmdline: serve --max-batch 8 → serve --max-batch 1", "env: OMP_NUM_THREADS=4 → "
                          "OMP_NUM_THREADS=1"))


def _regression(opened_at: float, *causes: Cause) -> Regression:
    return Regression(id="srv-1", target="srv", pid=7, opened_at=opened_at, severity="warning", score=6.0,
                      causes=list(causes))


COMPUTE = Cause("compute", 3.0, "CPU per token x1.8 (1.9 ms vs 1.05 ms)", 0.0019, 0.00105)


def test_a_regression_just_after_a_change_is_the_change_diff_first_then_mechanism():
    r = attribute_change(_regression(1030.0, COMPUTE), CHANGE)
    assert r.top_cause == "change" and r.change_id == CHANGE.id
    evidence = r.causes[0].evidence
    assert evidence.index("--max-batch 1") < evidence.index("OMP_NUM_THREADS") < evidence.index("CPU per token x1.8")
    assert r.causes[1] == COMPUTE and r.causes[0].score > COMPUTE.score
    # Applied again to the next window's re-ranking: the same, never two `change` causes.
    assert attribute_change(r, CHANGE) == r
    assert regression_from_dict(regression_to_dict(r)) == r


@pytest.mark.parametrize("opened_at", [999.0, 1000.0 + 60.001])
def test_before_the_change_or_too_long_after_is_not_the_change(opened_at):
    r = attribute_change(_regression(opened_at, COMPUTE), CHANGE)
    assert r.top_cause == "compute" and r.change_id is None


@pytest.mark.parametrize("outside", ["cpu_contention", "network"])
def test_an_outside_cause_is_not_the_change(outside):
    r = attribute_change(_regression(1010.0, Cause(outside, 5.0, "neighbour"), COMPUTE), CHANGE)
    assert r.top_cause == outside and r.change_id is None


def test_a_label_given_earlier_goes_when_an_outside_cause_leads():
    labelled = attribute_change(_regression(1010.0, COMPUTE), CHANGE)
    later = Regression(**{**labelled.__dict__, "causes": [Cause("network", 9.0, "loss"), *labelled.causes]})
    r = attribute_change(later, CHANGE)
    assert [c.label for c in r.causes] == ["network", "compute"] and r.change_id is None


def test_no_measured_mechanism_is_said():
    r = attribute_change(_regression(1010.0), CHANGE)
    assert r.top_cause == "change" and "no measured signal moved" in r.causes[0].evidence
    assert attribute_change(_regression(1010.0), None).causes == []


def test_the_onset_counts_from_when_the_change_was_seen():
    # A build that took three minutes to load and serve: its regression opens long after its start.
    slow_loader = ChangeNote(id=CHANGE.id, at=1000.0, diff=CHANGE.diff, seen_at=1180.0)
    assert attribute_change(_regression(1200.0, COMPUTE), slow_loader).top_cause == "change"
    assert attribute_change(_regression(1200.0, COMPUTE), CHANGE).top_cause == "compute"
    assert attribute_change(_regression(1241.0, COMPUTE), slow_loader).top_cause == "compute"


@pytest.mark.parametrize("growers, outside", [
    ((), False),  # nobody's growth read: the change, memory its mechanism
    ((Grower(pid=7, comm="srv", grew_bytes=2 << 30, seconds=60.0, member=True),), False),  # the new build grew
    ((Grower(pid=99, comm="alloc", grew_bytes=2 << 30, seconds=60.0),), True),  # a neighbour grew
])
def test_memory_is_outside_only_when_a_neighbour_grew(growers, outside):
    memory = Cause("memory", 4.0, "memory stall of the server's cgroup (PSI some) x6", growers=growers)
    r = attribute_change(_regression(1010.0, memory), CHANGE)
    if outside:
        assert r.top_cause == "memory" and r.change_id is None
    else:
        assert [c.label for c in r.causes] == ["change", "memory"]
        assert "mechanism: memory: memory stall" in r.causes[0].evidence
