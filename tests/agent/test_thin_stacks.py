"""The replay-time thinning of steady stacks (agent.evaluation.thin_stacks): exact in expectation, seeded, and
bursts and family windows left as recorded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from agent.evaluation.recording import LabelledWindow
from agent.evaluation.thin_stacks import thin_reading, thin_windows
from analysis.features import extract
from analysis.window import StackReading, Window


def _reading(rate: float = 3.0, samples: int = 15) -> StackReading:
    # Two threads seen at every tick (12 + 3 and 9 + 6 of 15), a third at 10 of the 15 ticks only.
    return StackReading(active={"sched;run;step": 12, "worker;run;infer": 9, "late;run;x": 4},
                        idle={"sched;run;Condition.wait": 3, "worker;run;lock_wait": 6, "late;run;poll": 6},
                        rate_hz=rate, samples=samples)


def _window(stacks: StackReading | None, start: float = 0.0) -> LabelledWindow:
    return LabelledWindow(Window(target="t", pid=1, start=start, end=start + 5.0, stacks=stacks), "normal", "steady", None)


def test_counts_and_ticks_are_thinned_exactly_in_expectation() -> None:
    s, p, n = _reading(), 1 / 3, 20000
    rng = np.random.default_rng(7)
    sums: dict[str, float] = {}
    ticks = 0.0
    waits_per_tick = []
    for _ in range(n):
        t = thin_reading(s, p, rng)
        ticks += t.samples
        for part in ("active", "idle"):
            for k, c in getattr(t, part).items():
                sums[k] = sums.get(k, 0) + c
        assert all(sum(c for k, c in {**t.active, **t.idle}.items() if k.startswith(th + ";")) <= t.samples
                   for th in ("sched", "worker", "late"))
        if t.samples:
            waits_per_tick.append(t.idle.get("worker;run;lock_wait", 0) / t.samples)
        assert t.rate_hz == pytest.approx(1.0)
    assert ticks / n == pytest.approx(s.samples * p, rel=0.01)
    for k, c in {**s.active, **s.idle}.items():
        assert sums[k] / n == pytest.approx(c * p, rel=0.03), k
    # A per-tick figure (the lock signal's form) is unbiased given the ticks kept: 6 of 15 ticks.
    assert np.mean(waits_per_tick) == pytest.approx(6 / 15, rel=0.02)


def test_a_rate_at_or_above_the_recorded_one_is_the_recording() -> None:
    s = _reading()
    assert thin_reading(s, 1.0, np.random.default_rng(0)) is s
    windows = [_window(s)]
    assert thin_windows(windows, 3.0, seed=0) == windows


def test_deterministic_per_seed_and_different_across_seeds() -> None:
    windows = [_window(_reading(), start=5.0 * i) for i in range(40)]
    a = thin_windows(windows, 1.0, seed=1, name="x")
    assert a == thin_windows(windows, 1.0, seed=1, name="x")
    assert a != thin_windows(windows, 1.0, seed=2, name="x")
    assert a != windows


def test_burst_and_missing_windows_stay_as_recorded() -> None:
    burst = StackReading(active={"sched;run;step": 200}, idle={"sched;run;wait": 45}, rate_hz=49.0, samples=245)
    windows = [_window(_reading()), _window(burst, 5.0), _window(None, 10.0), _window(_reading(), 15.0)]
    out = thin_windows(windows, 1.0, seed=0)
    assert out[1] == windows[1] and out[2] == windows[2]
    assert out[0].window.stacks.rate_hz == pytest.approx(1.0)
    # The lock signal is read off the thinned ticks: idle waits over ticks, still a thread count.
    f = extract(out[0].window)
    assert f.app_wait_threads is None or 0.0 <= f.app_wait_threads <= 3.0


def test_a_family_window_is_left_as_recorded() -> None:
    from analysis.window import MemberReading

    member = MemberReading(pid=2, role="worker")
    item = _window(_reading())
    item = dataclasses.replace(item, window=dataclasses.replace(item.window, members=[member]))
    assert thin_windows([item, _window(_reading(), 5.0)], 1.0, seed=0)[0] == item


def test_a_recording_made_with_long_steady_recordings_is_replayed_as_recorded() -> None:
    # recorded-neighbours was recorded with the default 15 s steady recordings: spanning it again merged three real
    # recordings (44 ticks each) into one of ~132, which thin_stacks did before session 23.
    from agent.evaluation.recording import read_recording
    from agent.evaluation.steady_gaps import SteadySpans, replay_spans, spanned_as_recorded

    scenarios = Path(__file__).resolve().parents[1] / "scenarios"
    spanned = read_recording(scenarios / "recorded-neighbours" / "gc.jsonl.gz")
    per_window = read_recording(scenarios / "recorded" / "steady.jsonl.gz")
    assert spanned_as_recorded(spanned.windows) and not spanned_as_recorded(per_window.windows)

    def ticks(span: int) -> list[int]:
        spans = SteadySpans(span)
        return [s.samples for w in spanned.windows if (s := spans.next(w).window.stacks) is not None]

    recorded = [w.window.stacks.samples for w in spanned.windows if w.window.stacks is not None]
    assert ticks(1) == recorded and max(ticks(3)) > 2 * max(recorded)
    # replay_spans (thin_stacks and steady_gaps replay through it) keeps them as recorded whatever span it is given.
    replayed, _ = replay_spans(spanned.windows, SteadySpans(3))
    assert [w.window.stacks.samples for w in replayed if w.window.stacks is not None] == recorded
