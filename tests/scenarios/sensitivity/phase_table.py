"""Per fault phase of a recording: what the server felt against the normal phase before it, and what the
detector said. The medians are over the phase's windows; the ratios are phase / preceding normal phase.

    python -m tests.scenarios.sensitivity.phase_table RECORDING.jsonl.gz...
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from agent.evaluation.command import replay
from agent.evaluation.detection import default_detector_factory
from agent.evaluation.recording import read_recording
from analysis.cause_signals import read_all
from analysis.features import Features, extract
from analysis.robust import median


def median_of(features: list[Features], read: Callable[[Features], float | None]) -> float | None:
    """The median of one reading over windows, those without it left out; None when none has it."""
    xs = [v for f in features if (v := read(f)) is not None]
    return median(xs) if xs else None


def phase_medians(by_phase: dict[int, list[Features]], read: Callable[[Features], float | None]) -> dict[int, float | None]:
    """median_of each phase's windows (features_by_phase's result)."""
    return {phase: median_of(features, read) for phase, features in by_phase.items()}


def _medians(features: list[Features], name: str) -> float | None:
    return median_of(features, (lambda f: f.mean_seconds) if name == "latency" else (lambda f: read_all(f)[name]))


def features_by_phase(path: Path) -> dict[int, list[Features]]:
    """A recording's windows as features, by the index of the scenario phase they fell in."""
    by_phase: dict[int, list[Features]] = {}
    for item in read_recording(path).windows:
        if item.phase is not None:
            by_phase.setdefault(item.phase, []).append(extract(item.window))
    return by_phase


def rows(path: Path) -> list[dict]:
    by_phase = features_by_phase(path)
    (run,) = replay([path], default_detector_factory())
    out, before = [], None
    for p in run.score.phases:
        if not p.is_fault:
            before = by_phase.get(p.index, [])
            continue
        now = by_phase.get(p.index, [])
        row = {"file": f"{path.parent.name}/{path.name}", "phase": p.index + 1, "label": p.label, "detected": p.detected,
               "delay_windows": p.delay_windows, "top_cause": p.top_cause}
        for name in ("latency", "runqueue", "involuntary"):
            a, b = _medians(before or [], name), _medians(now, name)
            row[name] = b
            row[f"{name}_ratio"] = None if a in (None, 0) or b is None else b / a
        out.append(row)
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    print("| recording | phase | label | mean latency (x normal before) | run-queue wait per CPU s (x) | "
          "involuntary per CPU s (x) | detected (delay, top cause) |")
    print("|---|---|---|---|---|---|---|")

    def fmt(v: float | None, r: float | None, digits: int) -> str:
        return "n/a" if v is None else f"{v:.{digits}f} (x{r:.2f})" if r is not None else f"{v:.{digits}f}"

    for arg in argv:
        for r in rows(Path(arg)):
            found = (f"yes ({r['delay_windows']} windows, {r['top_cause']})" if r["detected"] else "**missed**")
            print(f"| {r['file']} | {r['phase']} | {r['label']} | {fmt(r['latency'], r['latency_ratio'], 3)} | "
                  f"{fmt(r['runqueue'], r['runqueue_ratio'], 3)} | {fmt(r['involuntary'], r['involuntary_ratio'], 0)} | "
                  f"{found} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
