"""Could any joint bar on (latency shift, run-queue z) find the outside hog in the shared-host recordings?

The detector misses the outside CPU hog of `outside.toml` in both shared-host recordings (docs/detector.md,
"Sensitivity floor"): its latency shift is small and its run-queue rise only a few baseline sigmas. This asks
whether the two together would do it. It replays each set with the real detector and, for every run of
`sustained_windows` scored windows, takes the two quantities the sustained-shift test reads: the mean score less
the baseline's median score, and the run-queue signal's median as a robust z against the baseline. A bar
(shift >= T and z >= Z) must catch a block of the hog phase in every set; the best such bar is the one that
catches the fewest blocks of healthy normal traffic. Each run of consecutive caught normal blocks would be one
false alarm.

    python -m tests.scenarios.hog_bar tests/scenarios/recorded tests/scenarios/recorded-neighbours [--json]
"""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from agent.evaluation.recording import read_recording
from analysis.cause_signals import BY_NAME
from analysis.detector import LatencyDetector
from analysis.robust import median, robust_z

HOG_FILE, HOG_LABEL = "outside.jsonl.gz", "cpu_contention"


@dataclass(frozen=True)
class Block:
    kind: str  # "hog" (holds a window of the outside hog phase) or "normal" (only normal windows, detector healthy)
    run: str  # the recording and its index of consecutive blocks, so adjacent caught blocks count as one alarm
    index: int
    shift: float
    runq_z: float


def blocks(folder: Path) -> list[Block]:
    out = []
    for path in sorted(folder.glob("*.jsonl.gz")):
        det = LatencyDetector()
        n = det.sustained_windows
        floor = BY_NAME["runqueue"].min_change * det.sustained_change_fraction / 4  # as Attributor.persistent
        recent: list[tuple[str, float, float | None]] = []
        for i, item in enumerate(read_recording(path).windows):
            verdict = det.update(item.window)
            if verdict.state == "warmup" or verdict.score is None:
                recent.clear()
                continue
            runq = det.recent_[-1].get("runqueue") if det.recent_ else None
            recent.append((item.label, verdict.score, runq))
            stats = det.baseline_.stats().get("runqueue")
            xs = [r for _, _, r in recent[-n:] if r is not None]
            if len(recent) < n or not xs or stats is None:
                continue
            labels = {label for label, _, _ in recent[-n:]}
            kind = ("hog" if path.name == HOG_FILE and HOG_LABEL in labels
                    else "normal" if labels == {"normal"} and verdict.state == "healthy" else None)
            if kind is not None:
                shift = sum(s for _, s, _ in recent[-n:]) / n - det.score_ref_
                z = robust_z(median(xs), stats.median, stats.sigma, floor)
                out.append(Block(kind, f"{folder.name}/{path.name}", i, shift, z))
    return out


def alarms(caught: list[Block]) -> int:
    """Runs of consecutive caught blocks: each would open one episode."""
    caught = sorted(caught, key=lambda b: (b.run, b.index))
    return sum(1 for a, b in itertools.pairwise([None, *caught]) if a is None or a.run != b.run or b.index != a.index + 1)


def best_bar(sets: dict[str, list[Block]]) -> dict:
    normal = [b for bs in sets.values() for b in bs if b.kind == "normal"]
    hogs = [[b for b in bs if b.kind == "hog"] for bs in sets.values()]
    best = None
    for pick in itertools.product(*hogs):
        t, z = min(b.shift for b in pick), min(b.runq_z for b in pick)
        caught = [b for b in normal if b.shift >= t and b.runq_z >= z]
        if best is None or len(caught) < len(best[2]):
            best = (t, z, caught)
    assert best is not None, "a set has no hog block"
    t, z, caught = best
    # Blocks step one window (5 s) and overlap; the normal time is the count of distinct windows they end on.
    hours = len(normal) * 5 / 3600
    return {"shift": round(t, 2), "runq_z": round(z, 2), "normal_blocks": len(normal), "caught": len(caught),
            "caught_share": round(len(caught) / len(normal), 4), "alarms": alarms(caught),
            "alarms_per_hour": round(alarms(caught) / hours, 1),
            "hog_highest": {name: {"shift": round(max(b.shift for b in bs if b.kind == "hog"), 2),
                                   "runq_z": round(max(b.runq_z for b in bs if b.kind == "hog"), 2)}
                            for name, bs in sets.items()}}


def main(argv: list[str]) -> int:
    as_json = "--json" in argv
    folders = [Path(a) for a in argv if a != "--json"]
    if not folders:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    result = best_bar({f.name: blocks(f) for f in folders})
    if as_json:
        print(json.dumps(result, sort_keys=True))
    else:
        for name, h in result["hog_highest"].items():
            print(f"{name}: hog phase highest shift {h['shift']}, highest run-queue z {h['runq_z']}")
        print(f"best common bar: shift >= {result['shift']} and run-queue z >= {result['runq_z']} catches "
              f"{result['caught']} of {result['normal_blocks']} healthy normal blocks "
              f"({100 * result['caught_share']:.1f} %), {result['alarms']} false alarms "
              f"({result['alarms_per_hour']} per hour of normal time)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
