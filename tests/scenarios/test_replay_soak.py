"""The soak's rate recorded: 30 minutes of healthy traffic at 4 requests/s (`bench soak`'s load) beside the session's
other work, replayed. What it shows and why it stays open is in docs/BENCHMARKS.md ("Healthy traffic at the soak's
rate"): the detector opened two episodes on it live and opens the same two replayed, so the gap between live soaks
and replays is the load, not the replay. Here it measures what a burst costs over a long episode."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from agent.burst import DEFAULT_MAX_SECONDS, BurstPolicy
from agent.config import DEFAULT_BURST_HOLD_SEGMENTS
from agent.evaluation.bursts import replay_bursts
from agent.evaluation.detection import default_detector_factory, detect
from agent.evaluation.recording import read_recording

RECORDING = Path(__file__).resolve().parent / "soak" / "steady4.jsonl.gz"


@pytest.fixture(scope="module")
def replayed():
    rec = read_recording(RECORDING)
    return rec, detect(default_detector_factory(), rec.windows)


def test_healthy_traffic_at_the_soaks_rate_opens_no_more_than_the_two_episodes_analysed(replayed) -> None:
    rec, outcomes = replayed
    assert rec.scenario.rate == 4.0 and len(outcomes) >= 350 and {o.label for o in outcomes} == {"normal"}
    # The goal is none. The two are a real neighbour's CPU and disk use named `blocked`, and a slowdown of the
    # server's CPU that nothing in the guest shows, named `lock` from two stack recordings (docs/BENCHMARKS.md).
    assert sum(o.opened is not None for o in outcomes) <= 2


def test_a_long_episode_bursts_for_the_bound_and_its_hold_not_for_its_minutes(replayed) -> None:
    rec, outcomes = replayed
    bounded = replay_bursts(outcomes, rec.interval_seconds, BurstPolicy)
    unbounded = replay_bursts(outcomes, rec.interval_seconds, lambda s: BurstPolicy(s, max_seconds=math.inf))
    # Live windows end a few ms early or late: one more window may fall inside the bound.
    longest = math.ceil(DEFAULT_MAX_SECONDS / rec.interval_seconds) + 1 + DEFAULT_BURST_HOLD_SEGMENTS
    assert all(b.last - b.first + 1 <= longest for b in bounded.bursts), bounded.bursts
    # An episode here stays open for two minutes: unbounded, its burst lasted all of them.
    assert max(b.last - b.first + 1 for b in unbounded.bursts) > 2 * longest
    assert bounded.burst_windows < unbounded.burst_windows
    # Every opening still gets its burst from its first window (or before).
    assert bounded.openings == unbounded.openings and bounded.unsampled == unbounded.unsampled
