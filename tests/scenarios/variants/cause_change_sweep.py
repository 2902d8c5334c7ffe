"""Replay every recorded set at several `cause_change_windows` settings, side by side (docs/BENCHMARKS.md,
"Faults back to back"): the split must change nothing on recordings of single faults and find each fault of
back_to_back.jsonl.gz. One line per set, then each listed recording's fault phases (1-based, as the eval table).

usage: python -m tests.scenarios.variants.cause_change_sweep [RECORDING.jsonl.gz ...]
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from agent.evaluation.command import replay
from analysis.detector import LatencyDetector
from analysis.scoring import summarize

SCENARIOS = Path(__file__).resolve().parent.parent
SETS = ["recorded", "recorded-quiet", "recorded-fresh", "recorded-allthreads", "recorded-neighbours", "recorded-full",
        "variants/recorded", "sensitivity/recorded"]
SETTINGS = [("off", 10**6), ("1", 1), ("2", 2), ("3", 3)]


def main(argv: list[str]) -> int:
    listed = [Path(a) for a in argv] or [SCENARIOS / "variants/recorded/back_to_back.jsonl.gz"]
    for name, n in SETTINGS:
        factory = functools.partial(LatencyDetector, cause_change_windows=n)
        print(f"cause_change_windows {name}")
        for s in SETS:
            runs = replay(sorted((SCENARIOS / s).glob("*.jsonl.gz")), factory)
            sm = summarize([r.score for r in runs])
            episodes = sum(len(r.score.episodes) for r in runs)
            print(f"  {s:22s} precision {sm['precision']:.2f} recall {sm['recall']:.2f} "
                  f"attribution {sm['attribution_top1']:.2f} median delay {sm['median_delay_windows']} "
                  f"false alarms/h {sm['false_alarms_per_hour']:.2f} episodes {episodes}")
        for path in listed:
            for run in replay([path], factory):
                found = ", ".join(f"{p.index + 1} {p.label}: " + (f"{p.delay_windows} {p.top_cause}" if p.detected
                                                                    else "missed")
                                  for p in run.score.fault_phases)
                print(f"  {path.name}: {found}; episodes {len(run.score.episodes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
