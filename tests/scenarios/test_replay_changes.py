"""CI replay of the change set (tests/scenarios/changes, docs/changes.md "Scenarios"), one live run each
(docs/BENCHMARKS.md, "Changes to the target, recorded live"): the server restarted mid-run as a deploy does. What each
shows is pinned here, with the reason where it falls short: a change in either direction shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.evaluation import command
from agent.evaluation.detection import Tracker
from agent.evaluation.recording import Recording, read_recording
from analysis.change_report import compare, format_table, sides
from analysis.detector import LatencyDetector
from analysis.regression import Regression

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "recorded-changes"

# Recording -> each restart phase and the part its change's diff lists first (None: the same identity, a restart
# and no change).
RESTARTS: dict[str, dict[int, str | None]] = {
    "deploys": {1: None, 2: "env", 3: "cmdline", 4: "cmdline", 5: "cmdline"},
}
# The regressing changes: the phases labelled `change`.
REGRESSING = {"deploys": (3, 5)}
# The report from the recorded windows, per (recording, restart phase): its verdict and each judged row's.
# The fix of the batch window is an improvement in latency (p50 x0.23) and a regression in CPU per token (x1.15: the
# 300 ms window had batched requests, each step shared); latency at equal load decides the verdict (docs/changes.md),
# so it is an improvement with CPU per token as its trade-off, and the 300 ms window itself a regression whose CPU per
# token improved.
LATENCY = ("p50_at_equal_load", "p95_at_equal_load", "p99_at_equal_load")
VERDICTS: dict[tuple[str, int], tuple[str, dict[str, str]]] = {
    ("deploys", 2): ("no difference beyond noise", {f: "no difference beyond noise" for f in (*LATENCY, "cpu_per_token")}),
    ("deploys", 3): ("regression", {**{f: "regression" for f in LATENCY}, "cpu_per_token": "improvement"}),
    ("deploys", 4): ("improvement", {**{f: "improvement" for f in LATENCY}, "cpu_per_token": "regression"}),
    ("deploys", 5): ("regression", {f: "regression" for f in (*LATENCY, "cpu_per_token")}),
}


def _recording(name: str) -> Recording:
    return read_recording(RECORDED / f"{name}.jsonl.gz")


def _opened(recording: Recording) -> list[Regression]:
    """Each episode as it stood last: a regression that opens before its new process has settled (the change is
    recorded then) is relabelled on the windows after, as the daemon relabels it."""
    tracker = Tracker(LatencyDetector)
    found: dict[str, Regression] = {}
    for item in recording.windows:
        tracker.feed(item)
        verdict = tracker.last
        for r in (verdict.opened, verdict.regression, verdict.closed):
            if r is not None:
                found[r.id] = r
    return list(found.values())


def _changes(recording: Recording) -> dict[int, dict]:
    """Restart phase -> the change recorded for the process it started (by the window in which it settled)."""
    started = {w.window.pid: w.phase for w in reversed(recording.windows)}  # each pid's first phase
    out: dict[int, dict] = {}
    for w in recording.windows:
        if w.change is not None:
            phase = started[w.change["pid"]]
            assert phase not in out
            out[phase] = w.change
    return out


def _runs() -> dict:
    names = sorted(RESTARTS)
    return dict(zip(names, command.replay([RECORDED / f"{n}.jsonl.gz" for n in names], LatencyDetector), strict=True))


def test_every_recording_is_pinned() -> None:
    assert sorted(p.name.removesuffix(".jsonl.gz") for p in RECORDED.glob("*.jsonl.gz")) == sorted(RESTARTS)


@pytest.mark.parametrize("name", sorted(RESTARTS))
def test_one_target_a_process_per_restart_and_the_changes_the_agent_recorded(name: str) -> None:
    recording = _recording(name)
    pids = list(dict.fromkeys(w.window.pid for w in recording.windows))
    assert len(pids) == 1 + len(RESTARTS[name]) and {w.window.target for w in recording.windows} == {"workload"}
    changes = _changes(recording)
    assert {phase: change["diff"][0]["part"] for phase, change in changes.items()} == {
        phase: part for phase, part in RESTARTS[name].items() if part is not None}
    for change in changes.values():
        # Dated from the new process's start, before its first window; seen once it settled and served.
        first = next(w.window for w in recording.windows if w.window.pid == change["pid"])
        assert change["at"] <= first.start < change["seen_at"]


def test_every_regressing_change_is_found_labelled_change_and_nothing_else_opens() -> None:
    """Precision and recall on the change phases (the recordings are the live windows, replayed)."""
    runs = _runs()
    phases = [p for run in runs.values() for p in run.score.fault_phases]
    assert [(p.label, p.index) for p in phases] == [("change", i) for n in sorted(REGRESSING) for i in REGRESSING[n]]
    episodes = [e for run in runs.values() for e in run.score.episodes]
    precision = sum(e.phase is not None for e in episodes) / len(episodes)
    recall = sum(p.detected for p in phases) / len(phases)
    assert precision >= 0.95 and recall >= 0.95, (precision, recall, episodes)
    assert all(p.attributed for p in phases), [(p.label, p.top_cause) for p in phases]
    # Opened on the 2nd window after the restart (2 of 3 windows), labelled `change` once the new process settled.
    assert [p.delay_windows for p in phases] == [2, 2]


@pytest.mark.parametrize(("name", "phase"), [(n, i) for n in sorted(REGRESSING) for i in REGRESSING[n]])
def test_the_regression_lists_the_identity_diff_first_then_the_mechanism(name: str, phase: int) -> None:
    """As it stood on the phase's last window (a later change, the fix, takes the label off an episode still open)."""
    recording = _recording(name)
    change = _changes(recording)[phase]
    last = max(i for i, w in enumerate(recording.windows) if w.phase == phase)
    tracker = Tracker(LatencyDetector)
    for item in recording.windows[:last + 1]:
        tracker.feed(item)
    opened = tracker.last.regression
    assert opened is not None
    top = opened.causes[0]
    first = change["diff"][0]
    assert top.label == "change" and opened.change_id == change["id"]
    assert top.evidence.startswith(f"began after a change: cmdline: {first['before']} → {first['after']}")
    assert "mechanism: " in top.evidence or "no measured signal moved" in top.evidence


def test_a_neutral_restart_a_config_change_and_an_improvement_open_nothing() -> None:
    """Every episode of the set opened in a regressing change's phase or its two-window tail: none after the plain
    restart, the environment change or the improvement."""
    for name in RESTARTS:
        recording = _recording(name)
        index = {w.window.end: i for i, w in enumerate(recording.windows)}
        allowed = {i for i, w in enumerate(recording.windows) if w.phase in REGRESSING.get(name, ())}
        allowed |= {i + k for i in allowed for k in (1, 2)}
        assert [r.opened_at for r in _opened(recording) if index[r.opened_at] not in allowed] == [], name


@pytest.mark.parametrize(("name", "phase"), sorted(VERDICTS))
def test_the_before_after_report_from_the_recorded_windows(name: str, phase: int) -> None:
    """As `infersight changes --report` computes it from the store's windows (the recording holds the same)."""
    recording = _recording(name)
    changes = _changes(recording)
    change = changes[phase]
    earlier = [c["at"] for p, c in changes.items() if p < phase]
    before, after = sides([w.window for w in recording.windows], change["at"], change["pid"],
                          max(earlier, default=None))
    report = compare(before, after)
    verdict, rows = VERDICTS[(name, phase)]
    assert report.verdict == verdict, format_table(report)
    assert {r.figure: r.verdict for r in report.rows if r.figure in rows} == rows, format_table(report)
    # What moved against the verdict is named beside it, never hidden.
    assert set(report.trade_offs) == {f for f, v in rows.items() if v not in (verdict, "no difference beyond noise")}
    assert report.comparable_after >= 12
