"""The network's part of the clients' latency against its own baseline (analysis/network_part.py)."""

from __future__ import annotations

import math

import pytest

from analysis.attribution import SignalStats
from analysis.network_part import network_z

STATS = {"delivery_mean": SignalStats(median=0.002, sigma=0.001, count=30),
         "connect_wait": SignalStats(median=0.0, sigma=0.0, count=30)}


def test_the_rise_is_in_expected_latencies_over_the_floor_when_the_baseline_spread_is_smaller():
    # 0.15 s per request more on a 0.3 s expectation: half of it, over the 5 % floor (the spread is 0.3 %).
    z = network_z({"delivery_mean": 0.002, "connect_wait": 0.15}, STATS, 0.3, 0.05)
    assert z == pytest.approx(0.5 / 0.05)


def test_a_baseline_that_spreads_more_than_the_floor_scales_by_its_own_spread():
    stats = {**STATS, "connect_wait": SignalStats(median=0.01, sigma=0.06, count=30)}
    z = network_z({"delivery_mean": 0.002, "connect_wait": 0.16}, stats, 0.3, 0.05)
    assert z == pytest.approx((0.15 / 0.3) / (0.061 / 0.3))


def test_faster_than_usual_is_negative_and_unmeasured_is_none_not_zero():
    assert network_z({"delivery_mean": 0.0, "connect_wait": 0.0}, STATS, 0.3, 0.05) < 0
    assert network_z({"delivery_mean": None, "connect_wait": 0.0}, STATS, 0.3, 0.05) is None
    assert network_z({"delivery_mean": 0.002, "connect_wait": 0.0}, {**STATS, "connect_wait": None}, 0.3, 0.05) is None
    assert network_z({"delivery_mean": 0.002, "connect_wait": 0.0}, STATS, 0.0, 0.05) is None


def test_direct_strength_is_the_largest_move_of_the_delivery_probes_per_reply_signals_only():
    from analysis.attribution import Attributor
    from analysis.network_part import COUNTED, DIRECT, direct_strength

    stats = {**STATS, "delivery_p99": SignalStats(median=0.01, sigma=0.002, count=30),
             "retransmits": SignalStats(median=0.0, sigma=0.0, count=30)}
    # p99 delivery 0.6 s against a 10 ms median: x60; the retransmit count is not the clients' wait.
    got = direct_strength({"delivery_p99": 0.6, "retransmits": 50.0}, stats, Attributor())
    assert got == pytest.approx(math.log2(60))
    assert direct_strength({"delivery_p99": 0.01, "retransmits": 50.0}, stats, Attributor()) == 0
    assert direct_strength({}, stats, Attributor()) == 0
    # The SYN-ACK waits are events, counted against the baseline's rate (analysis/stall_events.py), not a ratio of
    # means: x60 of them is no direct strength here.
    assert "connect_wait" in COUNTED and "connect_wait" not in {s.name for s in DIRECT}
    assert direct_strength({"connect_wait": 0.6, "delivery_p99": 0.01}, stats, Attributor()) == 0
