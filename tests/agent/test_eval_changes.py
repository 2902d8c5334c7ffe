"""A change a recorded window carries (the server restarted with other arguments) reaches the replay: the regression
that follows it is labelled `change` with the diff first, as the daemon labels it; a restart without a change, or a
regression long after the change, keeps its measured cause; a recording with a malformed change is one error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from agent.evaluation import command
from agent.evaluation.detection import Tracker
from agent.evaluation.recording import LabelledWindow, RecordingError, RecordingWriter, read_recording
from analysis.scenario import parse_scenario
from analysis.window import GcReading, LatencyReading, Window
from tests.agent.eval_detector import ThresholdDetector

SCENARIO = parse_scenario('''
name = "synthetic slower build"
interval_seconds = 5
[load]
rate = 4.0
[[phase]]
seconds = 50
label = "normal"
[[phase]]
seconds = 100
label = "change"
restart = { args = ["--no-cache"] }
''')
CMDLINE = "python -m workload serve --port 4100"


def window(i: int, slow: bool, pid: int) -> Window:
    mean = 0.5 if slow else 0.1
    return Window(target="workload", pid=pid, start=1000.0 + 5 * i, end=1005.0 + 5 * i,
                  latency=LatencyReading(p50_seconds=mean, p95_seconds=mean * 2, p99_seconds=mean * 3,
                                         mean_seconds=mean, requests=20, request_rate=4.0,
                                         buckets={"0.1": 10.0, "+Inf": 10.0}),
                  gc=GcReading(collections=50 if slow else 1, pause_seconds=0.4 if slow else 0.004))


def stored_change(at: float, seen_at: float, after: str = f"{CMDLINE} --no-cache") -> dict:
    return {"id": f"workload-change-{at:.3f}", "target": "workload", "at": at, "seen_at": seen_at, "pid": 8,
            "diff": [{"part": "cmdline", "before": CMDLINE, "after": after}],
            "before": {"cmdline": CMDLINE}, "after": {"cmdline": after}}


def record(path: Path, change_at: int | None, slow_from: int = 11) -> Path:
    """Windows 0-9 from pid 7, 10-29 from pid 8 (the restart at window 10); slow from `slow_from`; the change (if
    any) carried by window `change_at`, as the live run records the window in which the new process settled."""
    writer = RecordingWriter(path, SCENARIO, 5.0, 1000.0)
    for i in range(30):
        phase = SCENARIO.phase_at(5 * i + 2.5)
        change = stored_change(1050.0, 1005.0 + 5 * i) if i == change_at else None
        writer.add(LabelledWindow(window(i, i >= slow_from, 7 if i < 10 else 8), SCENARIO.phases[phase].label,
                                  phase, change=change))
    return writer.close(complete=True)


def test_a_regression_after_a_recorded_change_is_labelled_change_with_the_diff_first(tmp_path: Path) -> None:
    path = record(tmp_path / "r.jsonl.gz", change_at=10)
    rec = read_recording(path)
    assert [w.change is not None for w in rec.windows].count(True) == 1
    assert rec.windows[10].change == stored_change(1050.0, 1055.0)
    assert rec.scenario.phases[1].restart is not None and rec.scenario.phases[1].restart.args == ("--no-cache",)
    tracker = Tracker(ThresholdDetector)
    outcomes = [tracker.feed(item) for item in rec.windows]
    opened = [o for o in outcomes if o.opened]
    assert len(opened) == 1 and opened[0].top_cause == "change"
    regression = tracker.last.regression
    assert regression.change_id == "workload-change-1050.000"
    assert regression.causes[0].evidence.startswith(f"began after a change: cmdline: {CMDLINE} → {CMDLINE} --no-cache;")
    assert "mechanism: gc:" in regression.causes[0].evidence and regression.causes[1].label == "gc"
    (run,) = command.replay([path], ThresholdDetector)
    assert [p.attributed for p in run.score.phases if p.is_fault] == [True]


def test_without_a_change_the_same_windows_keep_their_measured_cause(tmp_path: Path) -> None:
    rec = read_recording(record(tmp_path / "r.jsonl.gz", change_at=None))
    tracker = Tracker(ThresholdDetector)
    opened = [o for o in (tracker.feed(item) for item in rec.windows) if o.opened]
    assert [o.top_cause for o in opened] == ["gc"] and tracker.last.regression.change_id is None


def test_a_regression_beyond_the_onset_after_the_change_keeps_its_measured_cause(tmp_path: Path) -> None:
    # Seen at window 10's end (1055 s); a regression opening at window 24's end (1125 s) is past the 60 s onset.
    rec = read_recording(record(tmp_path / "r.jsonl.gz", change_at=10, slow_from=24))
    tracker = Tracker(ThresholdDetector)
    opened = [o for o in (tracker.feed(item) for item in rec.windows) if o.opened]
    assert [o.top_cause for o in opened] == ["gc"]


@pytest.mark.parametrize("change", ["cmdline changed", {"id": 5, "diff": []}, {"id": "x", "diff": "cmdline"}])
def test_a_change_that_is_not_a_stored_change_is_a_bad_recording(tmp_path: Path, change: object) -> None:
    good = record(tmp_path / "g.jsonl.gz", change_at=None)
    lines = gzip.decompress(good.read_bytes()).decode().splitlines()
    row = json.loads(lines[3])
    row["change"] = change
    bad = tmp_path / "b.jsonl.gz"
    bad.write_bytes(gzip.compress(("\n".join([*lines[:3], json.dumps(row), *lines[4:]]) + "\n").encode()))
    with pytest.raises(RecordingError, match=r"b\.jsonl\.gz:4: not a labelled window \(change must be a stored"):
        read_recording(bad)
