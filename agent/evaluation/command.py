"""`infersight eval`: live scenario runs or replays of recordings, scored, as a table or one JSON line."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from agent.evaluation.clients import compare
from agent.evaluation.detection import DetectorFactory, default_detector_factory, detect
from agent.evaluation.processes import EvalProcessError
from agent.evaluation.recording import RecordingError, read_recording
from analysis.scenario import Scenario, ScenarioError, load_scenario
from analysis.scoring import Outcome, RunScore, score_run, summarize

DEFAULT_INTERVAL = 5.0


class EvalUsageError(ValueError):
    """Arguments that cannot run; one line for the user."""


@dataclass
class ScoredRun:
    scenario: Scenario
    interval: float
    outcomes: list[Outcome]
    score: RunScore
    # The agent's clients' latency estimate beside what the load's clients measured (agent.evaluation.clients);
    # None for a recording made before the load's figures were kept.
    clients: dict[str, Any] | None = field(default=None)


def replay(paths: list[Path], factory: DetectorFactory) -> list[ScoredRun]:
    runs = []
    for path in paths:
        rec = read_recording(path)
        outcomes = detect(factory, rec.windows)
        runs.append(ScoredRun(rec.scenario, rec.interval_seconds, outcomes, score_run(rec.scenario.name, outcomes),
                              compare(rec.windows)))
    return runs


def live(paths: list[Path], factory: DetectorFactory | None, record: Path | None, interval: float | None,
         progress: TextIO, nice: int = 0) -> list[ScoredRun]:
    from agent.evaluation.live import run_live

    scenarios = [load_scenario(p) for p in paths]  # every file is checked before anything starts
    if record is not None and len(scenarios) > 1 and "{name}" not in str(record):
        raise EvalUsageError("--record with several scenarios needs {name} in the file name, e.g. rec/{name}.jsonl.gz")
    runs = []
    for path, scenario in zip(paths, scenarios):
        target = Path(str(record).replace("{name}", path.name.removesuffix(".toml"))) if record else None
        step = interval or scenario.interval_seconds or DEFAULT_INTERVAL
        result = run_live(scenario, step, factory, target, progress=progress, nice=nice)
        if result.recorded is not None:
            progress.write(f"recorded {len(result.windows)} windows to {result.recorded}\n")
        if factory is not None:
            runs.append(ScoredRun(scenario, step, result.outcomes, score_run(scenario.name, result.outcomes),
                                  compare(result.windows)))
    return runs


def main(scenarios: list[str], replay_files: list[str], record: str | None, as_json: bool, plot: str | None,
         interval: float | None, record_only: bool, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
         factory: DetectorFactory | None = None, nice: int = 0, bursts: bool = False) -> int:
    """Exit 0 when scored (or recorded), 1 when a run failed, 2 on bad input."""
    if bool(scenarios) == bool(replay_files):
        err.write("infersight: eval: give scenario files, or --replay with recordings (not both)\n")
        return 2
    if replay_files and (record or record_only):
        err.write("infersight: eval: --record and --record-only run scenarios live; they do not apply to --replay\n")
        return 2
    if record_only and (as_json or plot):
        err.write("infersight: eval: --record-only scores nothing, so --json and --plot have nothing to show\n")
        return 2
    if record_only and bursts:
        err.write("infersight: eval: --record-only scores nothing, so --bursts has nothing to replay\n")
        return 2
    if record_only and not record:
        err.write("infersight: eval: --record-only needs --record FILE\n")
        return 2
    if not record_only and factory is None:
        try:
            factory = default_detector_factory()
        except ImportError as exc:
            err.write(f"infersight: eval: the detector is not available ({exc}); --record-only records without it\n")
            return 1
    started = time.monotonic()
    try:
        if replay_files:
            assert factory is not None
            runs = replay([Path(p) for p in replay_files], factory)
        else:
            runs = live([Path(p) for p in scenarios], None if record_only else factory,
                        Path(record) if record else None, interval, err, nice=nice)
    except (ScenarioError, RecordingError, EvalUsageError) as exc:
        err.write(f"infersight: eval: {exc}\n")
        return 2
    except KeyboardInterrupt:
        err.write("infersight: eval: interrupted; every process it started was ended\n")
        return 130
    except (EvalProcessError, OSError) as exc:  # a process that would not start or answer: one line
        err.write(f"infersight: eval: {exc}\n")
        return 1
    if record_only:
        return 0
    summary = summarize([r.score for r in runs])
    if plot:
        from agent.evaluation.plot import PlotUnavailable, plot_runs

        try:
            plot_runs(runs, Path(plot))
        except (PlotUnavailable, OSError) as exc:
            err.write(f"infersight: eval: cannot plot: {exc}\n")
            return 1
        err.write(f"infersight: wrote {plot}\n")
    from agent.evaluation.report import table

    if bursts:
        from agent.evaluation.bursts import burst_table, replay_bursts

        names = [str(Path(p).with_suffix("").with_suffix("")) for p in replay_files] or [r.scenario.name for r in runs]
        out.write(burst_table([(name, replay_bursts(r.outcomes, r.interval)) for name, r in zip(names, runs)]))
        return 0
    if as_json:
        summary["seconds"] = round(time.monotonic() - started, 2)
        clients = {r.scenario.name: r.clients for r in runs if r.clients is not None}
        if clients:
            summary["clients"] = clients
        out.write(json.dumps(_jsonable(summary), sort_keys=True) + "\n")
    else:
        out.write(table(runs, summary))
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value
