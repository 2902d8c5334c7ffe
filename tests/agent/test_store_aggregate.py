"""Store.aggregate: per-bucket sums, non-null counts and maxes of window fields, computed inside SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.store import Store
from analysis.window import GcReading, LatencyReading, SyscallReading, Window


def w(start: float, p99: float | None, futex: int, target: str = "t") -> Window:
    return Window(target=target, pid=1, start=start, end=start + 5,
                  latency=None if p99 is None else LatencyReading(p99_seconds=p99, requests=1, request_rate=1.0),
                  syscalls=SyscallReading(counts={"futex": futex, "read": 1}), gc=GcReading(collections=2))


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "s") as s:
        for i, (p99, futex) in enumerate([(0.1, 10), (0.3, 20), (None, 30), (0.2, 40)]):
            s.add_window(w(100 + 5 * i, p99, futex))
        s.add_window(w(100, 9.9, 99, target="other"))
        yield s


def test_buckets_sum_count_and_max_each_field(store):
    fields = {"p99": "$.latency.p99_seconds", "sys": "sum($.syscalls.counts)", "gc": "$.gc.collections"}
    b = store.aggregate("t", 0, 1000, 10, fields)
    assert [x.start for x in b] == [100, 110]
    first, second = b
    assert first.windows == 2 and first.seconds == 10
    assert first.sums["p99"] == pytest.approx(0.4) and first.counts["p99"] == 2 and first.maxes["p99"] == 0.3
    assert first.sums["sys"] == 32 and first.sums["gc"] == 4
    # A window without a latency reading is not counted as a zero.
    assert second.counts["p99"] == 1 and second.sums["p99"] == pytest.approx(0.2)
    assert second.sums["sys"] == 72


def test_range_is_start_inclusive_end_exclusive(store):
    b = store.aggregate("t", 105, 115, 1000, {"p99": "$.latency.p99_seconds"})
    assert len(b) == 1 and b[0].windows == 2


@pytest.mark.parametrize("spec", ["latency.p99", "$.a'; DROP TABLE windows; --", "sum($.a", "$.A", "$..x"])
def test_field_paths_are_validated_not_inlined(store, spec):
    with pytest.raises(ValueError, match="must be a JSON path"):
        store.aggregate("t", 0, 1000, 10, {"x": spec})
    assert store.aggregate("t", 0, 1000, 10, {})[0].windows == 2


def test_bucket_size_must_be_positive(store):
    with pytest.raises(ValueError, match="bucket_seconds must be > 0"):
        store.aggregate("t", 0, 1000, 0, {})
