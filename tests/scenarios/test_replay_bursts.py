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


class ungated:
    """The trigger before the level: two rises running to a new high, whatever its height, on those windows only
    (no window of grace, no going on at a level) and held by the sampler as every burst was then."""

    def __init__(self, snapshot) -> None:
        self.policy = BurstPolicy(snapshot, rising_windows=2, min_score=float("-inf"), min_history=1,
                                  rise_min_windows=1, keep_score=float("inf"))

    def wants_burst(self, target: str) -> bool:
        return bool(self.policy.wants_burst(target))


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


class held:
    """Today's policy as the sampler took every answer before BurstAsk: held (`burst_hold_segments` after it)."""

    def __init__(self, snapshot) -> None:
        self.policy = BurstPolicy(snapshot)

    def wants_burst(self, target: str) -> bool:
        return bool(self.policy.wants_burst(target))


def test_rise_only_bursts_without_the_hold_cost_less_on_healthy_traffic_and_keep_every_onset() -> None:
    healthy = STEADY + LOAD_STEPS + [HERE / "soak" / "steady4.jsonl.gz"]
    now, before = replays(healthy), replays(healthy, held)
    print("\n" + burst_table(now))
    seconds = [sum(r.false_windows * r.interval for _, r in rows) for rows in (now, before)]
    # A false burst was its rise plus the 15 s hold; now its rise and one window of grace (docs/BENCHMARKS.md
    # "Rise-only bursts without the hold": 310 -> 200 burst seconds an hour at 4 req/s, 40 -> 20 on steady traffic).
    assert seconds[0] <= 0.6 * seconds[1], seconds
    faults_now, faults_before = replays(FAULTS), replays(FAULTS, held)
    assert [r.early for _, r in faults_now] == [r.early for _, r in faults_before]
