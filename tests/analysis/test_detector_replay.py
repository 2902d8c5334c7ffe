"""Replay of real windows (the bundled workload under gc, lock, syscall, netloss, SIGSTOP and cpuhog): what opens, what is named."""

import gzip
import json
from pathlib import Path

from analysis.detector import LatencyDetector
from analysis.window import Window

FIXTURE = Path(__file__).parent / "fixtures" / "windows_faults.jsonl.gz"


def load() -> tuple[list[Window], list[str]]:
    rows = [json.loads(line) for line in gzip.open(FIXTURE, "rt")]
    return [Window.from_dict(r) for r in rows], [r["_label"] for r in rows]


def phase_ends(labels: list[str]) -> dict[str, int]:
    """Index of the last window of each labelled phase."""
    return {lab: i for i, lab in enumerate(labels) if i + 1 == len(labels) or labels[i + 1] != lab}


def test_real_fault_run_opens_on_gc_and_names_each_fault_by_the_end_of_its_phase():
    windows, labels = load()
    # The recording starts with only 7 normal windows (35 s), so this replay warms up on 6.
    det = LatencyDetector(warmup_windows=6)
    verdicts = [det.update(w) for w in windows]
    first = next(i for i, v in enumerate(verdicts) if v.opened)
    assert labels[first] == "gc" and labels[:first].count("gc") <= 3
    assert verdicts[first].opened.top_cause == "gc"
    ends = phase_ends(labels)
    for label in ("gc", "lock", "syscalls", "blocked", "cpu_contention"):
        reg = verdicts[ends[label]].regression
        assert reg is not None and reg.top_cause == label, (label, reg and reg.causes)
    assert all(v.state == "warmup" for v in verdicts[:6])


def test_the_replay_is_deterministic_and_its_state_is_json():
    windows, _ = load()
    a, b = LatencyDetector(warmup_windows=6), LatencyDetector(warmup_windows=6)
    va = [a.update(w) for w in windows]
    vb = [b.update(w) for w in windows]
    assert va == vb
    assert json.loads(json.dumps(a.get_state()))["version"] == 1


def test_real_noisy_normal_traffic_and_a_plus_half_load_step_open_nothing():
    rows = [json.loads(line) for line in gzip.open(FIXTURE.with_name("windows_normal_step.jsonl.gz"), "rt")]
    det = LatencyDetector()  # the default warm-up: 24 windows, then 12 scored, most at +50 % load
    verdicts = [det.update(Window.from_dict(r)) for r in rows]
    assert [r["_label"] for r in rows].count("normal+50%") >= 10
    assert all(v.state == "warmup" for v in verdicts[:24])
    assert all(v.state == "healthy" and v.score is not None and v.score < 4.0 for v in verdicts[24:])
