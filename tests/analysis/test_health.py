"""Health: one state vocabulary for probes and sources, checked when built; copies share nothing."""

import pytest

from analysis.health import STATES, Health


@pytest.mark.parametrize("old", ["ok", "error", "up"])
def test_a_state_outside_the_vocabulary_is_refused_with_the_value(old):
    with pytest.raises(ValueError, match=repr(old)):
        Health(name="stacks", state=old)


def test_copy_and_dict():
    h = Health(name="gc", state="running", unsupported={42: "not a Python interpreter"}, detail={"x": 1})
    c = h.copy()
    c.unsupported[43] = "beyond max_targets"
    c.detail["x"] = 2
    assert h.unsupported == {42: "not a Python interpreter"} and h.detail == {"x": 1}
    assert h.up and not Health(name="gc", state="failed").up
    assert h.to_dict()["unsupported"] == {"42": "not a Python interpreter"}
    assert STATES == ("running", "failed", "unsupported", "stopped", "absent")
    assert not Health(name="gpu", state="absent").up
