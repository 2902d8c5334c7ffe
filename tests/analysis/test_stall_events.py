"""Stall events counted against the baseline's rate (analysis/stall_events.py) and the one-window rule that reads them
(LatencyDetector._decisive): the tail is the negative binomial predictive, its false-alarm rate under the baseline's
own rate stays under alpha, and the detector opens on a count a healthy window would not show, not on one event."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import replace

import pytest

from analysis import stall_events
from analysis.detector import LatencyDetector
from analysis.features import extract
from analysis.network_part import COUNTED, DIRECT
from tests.analysis import synth
from tests.analysis.synth import Load


def _pois(k: int, lam: float) -> float:
    return (1.0 if k == 0 else 0.0) if lam == 0 else math.exp(-lam + k * math.log(lam) - math.lgamma(k + 1))


def _binom(k: int, n: int, p: float) -> float:
    if p == 0:
        return 1.0 if k == 0 else 0.0
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p)
                    + (n - k) * math.log1p(-p))


def _nb_pmf(x: int, r: float, p: float) -> float:
    return math.exp(math.lgamma(x + r) - math.lgamma(r) - math.lgamma(x + 1) + r * math.log(p) + x * math.log1p(-p))


@pytest.mark.parametrize(("k", "n", "base_k", "base_n"), [(1, 21, 0, 860), (3, 21, 0, 860), (2, 20, 5, 400),
                                                          (6, 30, 40, 1000), (1, 5, 0, 100)])
def test_tail_is_the_negative_binomial_predictive_of_the_baselines_count(k, n, base_k, base_n):
    r, p = base_k + 0.5, base_n / (base_n + n)
    assert stall_events.tail(k, n, base_k, base_n) == pytest.approx(1 - sum(_nb_pmf(x, r, p) for x in range(k)),
                                                                    rel=1e-9, abs=1e-15)


def test_a_long_baseline_makes_the_tail_the_poisson_tail_of_its_rate():
    # 1,000 events in 10^7 trials: the rate is known, 1e-4 per trial; 20,000 trials expect 2.
    got = stall_events.tail(5, 20_000, 1_000, 1e7)
    assert got == pytest.approx(1 - sum(_pois(x, 2.0) for x in range(5)), rel=0.02)


def test_the_committed_burst_windows_chance():
    """The recorded burst (tests/scenarios/recorded-network/burst, w48): 3 of 21 connections waited for a resent
    SYN-ACK, where the baseline's 40 windows had 0 of 860. x14 as a ratio of means; counted, 4.3e-6."""
    assert stall_events.tail(3, 21, 0, 860) == pytest.approx(4.27e-6, rel=0.01)
    # Two of them would be 2.3e-4: a short baseline cannot tell two from chance, a long one can.
    assert stall_events.tail(2, 21, 0, 860) > 1e-4 and stall_events.tail(2, 21, 0, 720 * 21) < 1e-5


def test_nothing_counted_or_no_baseline_is_no_evidence():
    assert stall_events.tail(0, 21, 0, 860) == 1.0
    assert stall_events.tail(3, 0, 0, 860) == 1.0
    assert stall_events.tail(3, 21, 0, 0) == 1.0
    assert stall_events.baseline_counts([{"slow_connects": None, "connects": 10.0}, {}], "slow_connects",
                                        "connects") == (0.0, 0.0)
    assert stall_events.baseline_counts([{"slow_connects": 1.0, "connects": 20.0}, {"slow_connects": 0.0,
                                         "connects": 22.0}], "slow_connects", "connects") == (1.0, 42.0)


def _false_alarm_rate(p: float, base_n: int, n: int, alpha: float) -> float:
    """The exact chance that a window passes the test when its connections and the baseline's all wait at the same
    true rate p: the baseline's count K ~ Poisson(N p), the window's X ~ Binomial(n, p)."""
    total, lam = 0.0, base_n * p
    for base_k in range(int(lam + 12 * math.sqrt(lam + 1) + 20) + 1):
        x = 1
        while x <= n and stall_events.tail(x, n, base_k, base_n) > alpha:
            x += 1
        if x <= n:
            total += _pois(base_k, lam) * sum(_binom(j, n, p) for j in range(x, n + 1))
    return total


@pytest.mark.parametrize("alpha", [1e-3, 1e-5])
def test_the_false_alarm_rate_under_the_baselines_own_rate_is_at_most_alpha(alpha):
    """Whatever the healthy rate of slow connections (none to 10 %), the baseline's length (100 to 14,400
    handshakes) and the window's (5 to 60): a healthy window passes the test at most alpha of the time (exactly
    computed; the worst case found is 0.77 alpha)."""
    worst = max(_false_alarm_rate(p, base_n, n, alpha) / alpha for base_n in (100, 400, 840, 3000, 14_400)
                for n in (5, 21, 60) for p in (1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1))
    assert 0.3 < worst <= 1.0  # not vacuous: the bound is nearly reached somewhere


def test_connect_wait_is_counted_and_no_longer_a_ratio_of_means():
    assert COUNTED == ("connect_wait",) and "connect_wait" not in {s.name for s in DIRECT}
    assert stall_events.EVENTS == (("slow_connects", "connects"),)


# -- the detector ---------------------------------------------------------------------------------------------------

@functools.cache
def _armed(synack_loss: float) -> str:
    det = LatencyDetector()
    for i in range(60):
        det.update(synth.window(i, Load(delivery=True, synack_loss=synack_loss)))
    return json.dumps(det.get_state())


def _detector(synack_loss: float = 0.0, **params) -> LatencyDetector:
    det = LatencyDetector(**params)
    det.set_state(json.loads(_armed(synack_loss)))
    return det


def _slow(i: int, slow: int, load: Load = Load(delivery=True)) -> synth.Window:
    """Window i with `slow` of its connections (one per request) waiting 1 s for a resent SYN-ACK."""
    w = synth.window(i, load)
    d = replace(w.delivery, synack_retransmits=slow, connects=int(w.latency.requests), slow_connects=slow,
                connect_wait_seconds=1.0 * slow)
    return replace(w, delivery=d)


def _first_open(det: LatencyDetector, burst) -> int | None:
    ws = [burst] + [synth.window(61 + j, Load(delivery=True)) for j in range(6)]
    found = [i for i, w in enumerate(ws) if det.update(w).opened is not None]
    return found[0] if found else None


def test_three_slow_connections_in_one_window_open_network_at_once_though_under_x16():
    w = _slow(60, 3)
    f = extract(w)
    assert f.connects == f.requests and 14 <= f.connect_wait_per_request / 0.01 < 16  # the ratio bar would not
    det = _detector()
    v = det.update(w)
    assert v.opened is not None and v.opened.top_cause == "network", (v.state, v.score)
    assert det.stall_event_chance({"slow_connects": 3.0, "connects": f.connects}) < det.stall_event_alpha


def test_the_same_window_after_a_baseline_that_shows_such_waits_needs_a_second_window():
    """A host whose healthy windows have 5 % of connections waiting: three of twenty is its usual, not news."""
    det = _detector(synack_loss=0.05)
    assert det.stall_event_chance({"slow_connects": 3.0, "connects": 20.0}) > 0.01
    assert _first_open(det, _slow(60, 3)) is None


def test_one_slow_connection_in_a_light_window_never_opens_alone():
    """One connection of five waited 1 s: x20 as a ratio of means over the 10 ms floor (which opened one window alone
    before the count), and a network part far past critical_score. One event is no rate: the count test wants at
    least two even after the longest baseline."""
    w = _slow(60, 1, Load(delivery=True, rate=1.0))
    f = extract(w)
    assert f.requests <= 6 and f.connect_wait_per_request / 0.01 >= 16
    assert _first_open(_detector(), w) is None
    assert stall_events.tail(1, 5, 0, 720 * 20) > 1e-4


def test_stall_event_alpha_is_the_edge():
    f = extract(_slow(60, 3))
    chance = _detector().stall_event_chance({"slow_connects": 3.0, "connects": f.connects})
    assert _first_open(_detector(stall_event_alpha=chance * 1.01), _slow(60, 3)) == 0
    assert _first_open(_detector(stall_event_alpha=chance * 0.99), _slow(60, 3)) is None
    with pytest.raises(ValueError, match="stall_event_alpha"):
        LatencyDetector(stall_event_alpha=0.0)


def test_the_baselines_counts_survive_a_restart():
    det = _detector()
    before = det.stall_event_chance({"slow_connects": 3.0, "connects": 21.0})
    again = LatencyDetector()
    again.set_state(json.loads(json.dumps(det.get_state())))
    assert again.stall_event_chance({"slow_connects": 3.0, "connects": 21.0}) == before < 1e-5
    rows = [r.signals for r in again.baseline_.rows]
    assert stall_events.baseline_counts(rows, "slow_connects", "connects")[1] > 500
