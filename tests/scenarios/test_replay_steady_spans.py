"""Steady py-spy recordings of three windows (`[stacks] steady_segment_seconds = 15`), replayed: the lock fault
whose signal is read from idle stacks is still found and named when the windows between two recordings read the
latest one (analysis.steady_stacks); read as "no stacks", it was missed (agent.evaluation.steady_gaps)."""

from __future__ import annotations

from pathlib import Path

from agent.evaluation.recording import read_recording
from agent.evaluation.steady_gaps import SteadySpans, replay_spans
from analysis.scoring import score_run

LOCK = Path(__file__).resolve().parent / "recorded" / "lock.jsonl.gz"


def _lock_phase(marked: bool):
    rec = read_recording(LOCK)
    windows, outcomes = replay_spans(rec.windows, SteadySpans(3, marked=marked))
    assert sum(w.window.stacks is not None for w in windows) == len(windows) // 3  # two of three windows wait
    (phase,) = score_run(rec.scenario.name, outcomes).fault_phases
    return phase


def test_the_lock_fault_is_found_and_named_with_windows_between_recordings_reading_the_latest() -> None:
    phase = _lock_phase(marked=True)
    assert phase.detected and phase.top_cause == "lock"
    assert phase.delay_seconds is not None and phase.delay_seconds <= 35  # 30 s with a recording per window


def test_read_as_no_stacks_the_windows_between_lose_the_lock_fault() -> None:
    # Why the carry exists: the same recording with the windows between read as stacks missing.
    assert not _lock_phase(marked=False).detected
