"""CI replay of the recorded suite with the real detector, and proof that it never reads the injected fault's name."""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.evaluation import command
from agent.evaluation.detection import detect
from agent.evaluation.recording import LabelledWindow, read_recording
from analysis.features import extract
from analysis.window import Window

HERE = Path(__file__).resolve().parent
# Two recordings of the whole suite: `recorded` on a host shared with other tenants (load average 1-35), the one the
# detector was tuned on; `recorded-quiet` a fresh live run on a quiet host (load average < 1), never tuned on.
RECORDED = sorted((HERE / "recorded").glob("*.jsonl.gz"))
RECORDED_QUIET = sorted((HERE / "recorded-quiet").glob("*.jsonl.gz"))
# A third, `recorded-fresh`: the fresh live run after the sustained-shift test was added (2026-12-02), never tuned
# on; the host was quiet but for two bursts of the author's own work (docs/BENCHMARKS.md, "Detector").
RECORDED_FRESH = sorted((HERE / "recorded-fresh").glob("*.jsonl.gz"))
# A fourth, `recorded-allthreads`: the first live run with context switches summed over every thread (2026-12-02
# 04:06-05:37 UTC, the host kept quiet), never tuned on; the earlier sets hold the main thread's counts only.
RECORDED_ALLTHREADS = sorted((HERE / "recorded-allthreads").glob("*.jsonl.gz"))
# A fifth, `recorded-neighbours`: the current code's live run on a shared host (2026-12-02 06:33-08:04 UTC), the
# other tenants two loops of `neighbours.py` running test suites with random pauses; never tuned on. Its `outside`,
# `steady` and `load_steps` re-recorded beside the same loops on 2026-12-04 with run-queue culprits and PSI, and
# `cpuhog`, `gc`, `io` and `lock` on 2026-12-05, then `cpuhog` again (its spinners' pids recorded as the culprit),
# `netloss`, `nocache` and `syscall` later that day: no 12-02 take is left.
RECORDED_NEIGHBOURS = sorted((HERE / "recorded-neighbours").glob("*.jsonl.gz"))
# A sixth, `recorded-full`: the live run of the code of 2026-12-03 (0ce1f12, 06:55-08:26 UTC, the host kept quiet),
# the first whose windows carry everything the agent now collects (threads' state from /proc, unanswered and
# unreachable scrapes, the cause-change split); never tuned on.
RECORDED_FULL = sorted((HERE / "recorded-full").glob("*.jsonl.gz"))
SETS = {"shared host": RECORDED, "quiet host": RECORDED_QUIET, "fresh": RECORDED_FRESH,
        "all threads": RECORDED_ALLTHREADS, "neighbours": RECORDED_NEIGHBOURS, "full": RECORDED_FULL}
# Words that name an injected fault or its machinery: the fault switches' module, classes, threads and helpers.
FAULT_WORDS = re.compile(r"fault|GcChurn|SyscallStorm|LockHolder|DiskSync|NoCache|CpuHog|Netloss|netloss|cpuhog|"
                         r"hog\.py|sigstop|nftdrop|workload:", re.IGNORECASE)


def detector_factory():
    from analysis.detector import LatencyDetector

    return LatencyDetector


def _anonymise(text: str) -> str:
    # The same word always becomes the same stand-in, so stack distributions keep their shape.
    return FAULT_WORDS.sub(lambda m: f"x{abs(hash(m.group(0).lower())) % 10**8:08d}", text)


def strip(value: Any) -> Any:
    """Drop every `workload:` key and rename every fault-naming word, anywhere in a Window's data."""
    if isinstance(value, dict):
        out: dict = {}
        for key, v in value.items():
            if isinstance(key, str) and key.startswith("workload:"):
                continue
            new_key = _anonymise(key) if isinstance(key, str) else key
            v = strip(v)
            out[new_key] = out[new_key] + v if new_key in out and isinstance(v, int | float) else v
        return out
    if isinstance(value, list):
        return [strip(v) for v in value]
    if isinstance(value, str):
        return _anonymise(value)
    return value


def stripped(items: list[LabelledWindow]) -> list[LabelledWindow]:
    return [replace(i, window=Window.from_dict(strip(i.window.to_dict()))) for i in items]


@pytest.mark.parametrize("paths", list(SETS.values()), ids=list(SETS))
def test_the_suite_is_recorded(paths: list[Path]) -> None:
    names = {p.name.removesuffix(".jsonl.gz") for p in paths}
    assert {"gc", "lock", "syscall", "netloss", "cpuhog", "nocache", "io", "load_steps", "outside", "steady"} <= names, names


def test_the_newest_set_carries_what_the_older_ones_predate() -> None:
    # Replays of the older sets cannot exercise the threads' state or the unanswered scrapes; this set's can.
    rec = read_recording(next(p for p in RECORDED_FULL if p.name.startswith("outside")))
    assert all(extract(i.window).stuck_threads is not None for i in rec.windows)
    assert any(i.window.unanswered for i in rec.windows)


def test_stripping_names_the_fault_would_give_changes_something_to_strip() -> None:
    rec = read_recording(next(p for p in RECORDED if p.name.startswith("lock")))
    before = json.dumps([i.window.to_dict() for i in rec.windows])
    after = json.dumps([i.window.to_dict() for i in stripped(rec.windows)])
    assert FAULT_WORDS.search(before) and not FAULT_WORDS.search(after)


@pytest.mark.parametrize("path", [p for paths in SETS.values() for p in paths], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_detector_does_not_read_what_names_the_fault(path: Path) -> None:
    factory = detector_factory()
    rec = read_recording(path)
    plain = detect(factory, rec.windows)
    blind = detect(factory, stripped(rec.windows))
    key = [(o.state, o.opened is not None, o.top_cause) for o in plain]
    assert key == [(o.state, o.opened is not None, o.top_cause) for o in blind]


# The fault phases the detector misses today (docs/BENCHMARKS.md, "Detector"). One: the outside CPU hog of
# `outside.toml` on the shared host, where other tenants already filled the run queue: the hog raised the server's
# run-queue wait x2 over a baseline that wandered +-70 % on its own (other "normal" stretches of the same recordings
# show x2.5 with latency up), so neither the per-window tests nor the sustained-shift test (which needs a baseline
# quiet enough to tell, `sustained_min_z`) can tell it from the tenants. The quiet host's small shifts (the same hog,
# x1.2 latency; the `io` switch, x1.15) are found by the sustained-shift test. The live run beside neighbours, with
# all-thread context switches, misses the same phase for the same reason: the hog raised the server's mean latency
# x1.2 and its run-queue wait per CPU second x2.6 over a baseline the neighbours had already spread, and the
# involuntary-switch witness stayed flat (the neighbours hold it near 1,000 per CPU second against ~370 on a quiet
# host). Its `outside` re-recorded on 2026-12-04 with the run-queue culprits and PSI is found since: the CPU stall of
# the server's cgroup and the one neighbour that led its run-queue wait are the direct evidence
# (LatencyDetector._contention, docs/detector.md "Contention named by its neighbour"). The `shared host` set
# (`recorded/`) carries neither, so it is still missed there. A new miss fails here.
KNOWN_MISSES = {
    "shared host": {("faults from outside the server", "cpu_contention")},
    "neighbours": set(),
    "quiet host": set(),
    "fresh": set(),
    "all threads": set(),
    "full": set(),
}


def test_the_missed_phases_are_exactly_the_known_ones() -> None:
    for name, paths in SETS.items():
        runs = command.replay(paths, detector_factory())
        missed = {(r.scenario.name, p.label) for r in runs for p in r.score.fault_phases if not p.detected}
        wrong = {(r.scenario.name, p.label, p.top_cause) for r in runs for p in r.score.fault_phases
                 if p.detected and p.top_cause != p.label}
        assert missed == KNOWN_MISSES[name], (name, missed)
        assert not wrong, (name, wrong)


# The fresh run is left out: its two episodes in normal traffic (below) break the false-alarm bound.
@pytest.mark.parametrize("name", ["shared host", "quiet host", "all threads", "neighbours", "full"])
def test_replay_of_the_suite_meets_the_issue_targets(name: str) -> None:
    paths = SETS[name]
    factory = detector_factory()
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = command.main(scenarios=[], replay_files=[str(p) for p in paths], record=None, as_json=True, plot=None,
                        interval=None, record_only=False, out=out, err=err, factory=factory)
    assert code == 0, err.getvalue()
    assert time.monotonic() - started < 120
    s = json.loads(out.getvalue().strip().splitlines()[-1])
    phases = sum(v["phases"] for v in s["per_label"].values())
    assert s["recall"] >= (phases - len(KNOWN_MISSES[name])) / phases, s
    assert s["precision"] >= 0.95 and s["attribution_top1"] >= 0.9, s
    assert s["median_delay_windows"] <= 2 and s["false_alarms_per_hour"] <= 1, s
    # No episode during the benign load steps.
    steps = [v for k, v in s["scenarios"].items() if "load steps" in k]
    assert steps and all(v["episodes"] == 0 for v in steps), steps


# The fresh run's two episodes outside every fault phase, each opened while the author's own work loaded the host
# (docs/BENCHMARKS.md): helpers' test runs at 00:43 UTC (load average 6.9; the server's mean latency 1.5 s, its
# run-queue wait per CPU second x9) and a clean-clone setup installing torch at 01:02 (the eval's own collection
# loop stalled 18 s, one window had no request). Real contention, labelled normal by the schedule; a new one fails.
# (scenario, the window the episode opened on)
KNOWN_FRESH_FALSE_ALARMS = {("busy processes on the server's CPUs", 81), ("benign load steps +50% and -50%", 52)}


def test_the_fresh_runs_episodes_outside_fault_phases_are_exactly_the_known_ones() -> None:
    runs = command.replay(RECORDED_FRESH, detector_factory())
    outside = {(r.scenario.name, e.window) for r in runs for e in r.score.episodes if e.phase is None}
    assert outside == KNOWN_FRESH_FALSE_ALARMS
