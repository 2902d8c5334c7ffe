"""The stack sampler's bursts replayed over the recorded suite: healthy traffic rarely starts one, faults still do early."""

from __future__ import annotations

from pathlib import Path

from agent.burst import OUTSIDE_CAUSES, BurstPolicy
from agent.evaluation.bursts import burst_table, replay_bursts
from agent.evaluation.detection import detect
from agent.evaluation.recording import read_recording

HERE = Path(__file__).resolve().parent
SETS = sorted(p for p in HERE.glob("recorded*") if p.is_dir())
STEADY = [s / "steady.jsonl.gz" for s in SETS if (s / "steady.jsonl.gz").exists()]
LOAD_STEPS = [s / "load_steps.jsonl.gz" for s in SETS if (s / "load_steps.jsonl.gz").exists()]
# The fault scenarios of the newest full set, for the onset: replaying every set takes a minute.
FAULTS = sorted(p for p in (HERE / "recorded-full").glob("*.jsonl.gz") if p.name not in {"steady.jsonl.gz", "load_steps.jsonl.gz"})


def ungated(snapshot) -> BurstPolicy:
    """The trigger before the level: two rises running to a new high, whatever its height."""
    return BurstPolicy(snapshot, rising_windows=2, min_score=float("-inf"), min_history=1)


def replays(paths: list[Path], policy=BurstPolicy, outside: list[int] | None = None):
    """(name, BurstReplay) per recording; `outside` gets, per recording, its openings whose top cause is outside."""
    from analysis.detector import LatencyDetector

    rows = []
    for path in paths:
        rec = read_recording(path)
        outcomes = detect(LatencyDetector, rec.windows)
        rows.append((f"{path.parent.name}/{path.name}", replay_bursts(outcomes, rec.interval_seconds, policy)))
        if outside is not None:
            outside.append(sum(1 for o in outcomes if o.opened is not None and o.top_cause in OUTSIDE_CAUSES))
    return rows


def false_per_hour(rows) -> float:
    return sum(r.false_bursts for _, r in rows) * 3600 / sum(r.seconds for _, r in rows)


def test_steady_traffic_starts_at_most_two_false_bursts_an_hour() -> None:
    assert len(STEADY) >= 6
    gated, before = replays(STEADY), replays(STEADY, ungated)
    print("\n" + burst_table(gated))
    # The goal (docs/BENCHMARKS.md, "Bursts"), and the ungated trigger missing it by far (8 an hour when written).
    assert false_per_hour(gated) <= 2.0
    assert false_per_hour(before) > 4.0


def test_load_steps_start_fewer_false_bursts_than_the_ungated_trigger() -> None:
    gated, before = replays(LOAD_STEPS), replays(LOAD_STEPS, ungated)
    print("\n" + burst_table(gated))
    assert false_per_hour(gated) <= 2.0 < false_per_hour(before)


def test_faults_still_burst_before_their_regression_opens() -> None:
    outside: list[int] = []
    gated, before = replays(FAULTS, outside=outside), replays(FAULTS, ungated)
    print("\n" + burst_table(gated))
    openings = sum(r.openings for _, r in gated)
    assert openings >= len(FAULTS)
    # Every opening is sampled at the burst rate from its first window but those whose top cause is another
    # process taking the CPUs (OUTSIDE_CAUSES), and at least as many onsets are sampled as by the ungated trigger.
    # (An outside opening may still fall in the hold of a burst its rising score started.)
    assert all(r.unsampled <= n for (_, r), n in zip(gated, outside)), ([r.unsampled for _, r in gated], outside)
    assert sum(outside) < openings / 2
    assert sum(r.early for _, r in gated) >= sum(r.early for _, r in before) > 0
