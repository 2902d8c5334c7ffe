"""CI replay of the suite run with the engine in its own process (`serve --engine-process`, vLLM's shape), watched
as one family target: each fault in the engine is found and named, and the process a cause names is the engine
(issue 31). Recorded live: docs/BENCHMARKS.md, "The suite with an engine process"."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.evaluation import command
from agent.evaluation.recording import read_recording
from analysis.detector import LatencyDetector

HERE = Path(__file__).resolve().parent
RECORDED_ENGINE = sorted((HERE / "recorded-engine").glob("*.jsonl.gz"))
SCENARIOS = sorted((HERE / "variants" / "engine_process").glob("*.toml"))
ENGINE = "infersight::EngineCore"
# Faults whose evidence lives in the engine's own process: its GC, its lock, its syscalls and writes, its work per
# token. (A CPU hog or packet loss acts from outside both processes; which member shows it most is a measurement.)
IN_THE_ENGINE = ("gc", "lock", "syscalls", "blocked", "compute")


def test_every_engine_process_scenario_is_recorded() -> None:
    assert {p.name.removesuffix(".jsonl.gz") for p in RECORDED_ENGINE} == {p.stem for p in SCENARIOS}


def test_the_recorded_windows_are_a_family_with_the_engine_in_it() -> None:
    for path in RECORDED_ENGINE:
        windows = [item.window for item in read_recording(path).windows]
        assert all(any(m.role == ENGINE for m in w.members) for w in windows[5:]), path.name


# Every phase found is named. The lock in the engine was `unknown` while causes were ranked on the family's totals
# only: its signals rose in the engine (futex off-CPU x1.55) but the API process's idle threads diluted the total to
# x1.03; each member's own signals are ranked too now (docs/detector.md, "Which process").
KNOWN_MISATTRIBUTED: set[tuple[str, str]] = set()


def test_replay_finds_every_fault_without_a_false_alarm_and_names_all_but_the_known_one() -> None:
    out, err = io.StringIO(), io.StringIO()
    code = command.main(scenarios=[], replay_files=[str(p) for p in RECORDED_ENGINE], record=None, as_json=True,
                        plot=None, interval=None, record_only=False, out=out, err=err, factory=LatencyDetector)
    assert code == 0, err.getvalue()
    s = json.loads(out.getvalue().strip().splitlines()[-1])
    assert s["precision"] >= 0.95 and s["recall"] >= 0.95, s
    assert s["false_alarms_per_hour"] <= 1 and s["median_delay_windows"] <= 2, s
    runs = command.replay(RECORDED_ENGINE, LatencyDetector)
    wrong = {(r.scenario.name, p.label) for r in runs for p in r.score.fault_phases
             if p.detected and p.top_cause != p.label}
    assert wrong == KNOWN_MISATTRIBUTED


def test_the_engine_killed_and_restarted_opens_nothing() -> None:
    [run] = command.replay([HERE / "recorded-engine" / "engine_restart.jsonl.gz"], LatencyDetector)
    assert run.score.episodes == [], run.score.episodes


@pytest.mark.parametrize("path", RECORDED_ENGINE, ids=lambda p: p.name)
def test_a_cause_in_the_engine_names_the_engine_process(path: Path) -> None:
    recording = read_recording(path)
    detector = LatencyDetector()
    named = []
    for item in recording.windows:
        verdict = detector.update(item.window)
        if verdict.opened is not None and verdict.opened.causes[0].label in IN_THE_ENGINE:
            named.append(verdict.opened.causes[0])
    engine_pids = {m.pid for item in recording.windows for m in item.window.members if m.role == ENGINE}
    for cause in named:
        assert cause.process == ENGINE and cause.pid in engine_pids, cause
        assert f"in pid {cause.pid} ({ENGINE})" in cause.evidence
