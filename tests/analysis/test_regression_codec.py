"""regression_from_dict: msgspec decodes a stored regression, nested records and all, and names a bad field."""

import pytest

from analysis.regression import Cause, FunctionShift, Regression, regression_from_dict, regression_to_dict


def _regression() -> Regression:
    return Regression(id="r1", target="server", pid=42, opened_at=100.5, severity="critical", score=7.25,
                      causes=[Cause("gc", 3.0, "GC pause 41 ms/s vs 0.8 ms/s (x51)", 0.041, 0.0008)],
                      functions=[FunctionShift("collect", 0.01, 0.3)], closed_at=160.0, baseline_start=0.0,
                      baseline_end=90.0)


def test_a_stored_regression_decodes_to_the_same_records():
    back = regression_from_dict(regression_to_dict(_regression()))
    assert back == _regression()
    assert isinstance(back.causes[0], Cause) and isinstance(back.functions[0], FunctionShift)


def test_a_field_of_the_wrong_type_is_named():
    data = regression_to_dict(_regression())
    data["causes"][0]["score"] = "high"
    with pytest.raises(ValueError, match=r"\$\.causes\[0\]\.score"):
        regression_from_dict(data)


def test_the_records_own_checks_still_run():
    data = regression_to_dict(_regression())
    data["severity"] = "page"
    with pytest.raises(ValueError, match="severity must be one of warning, critical"):
        regression_from_dict(data)
