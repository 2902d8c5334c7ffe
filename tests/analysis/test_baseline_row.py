"""BaselineRow.from_dict: msgspec reads back what to_dict wrote, the +Inf bucket bound included, through JSON."""

import json
import math

import pytest

from analysis.baseline import BaselineRow
from analysis.latency_model import Row


def _row() -> BaselineRow:
    latency = Row(n=120.0, rate=2.0, tpr=30.0, mean=0.08, p50=0.07, p99=0.2,
                  buckets=((0.05, 10.0), (0.1, 100.0), (math.inf, 120.0)), cpu_wait=None)
    return BaselineRow(start=0.0, end=5.0, latency=latency, signals={"gc": 0.001, "lock": None}, jsd=0.02)


def test_a_row_survives_strict_json_and_back():
    text = json.dumps(_row().to_dict(), allow_nan=False)  # strict JSON: the +Inf bound is the string "+Inf"
    back = BaselineRow.from_dict(json.loads(text))
    assert back == _row()
    assert isinstance(back.latency, Row) and back.latency.buckets[-1][0] == math.inf


def test_a_field_that_does_not_fit_is_a_value_error_naming_it():
    data = _row().to_dict()
    data["latency"]["p99"] = "slow"
    with pytest.raises(ValueError, match=r"\$\.latency\.p99"):
        BaselineRow.from_dict(data)
