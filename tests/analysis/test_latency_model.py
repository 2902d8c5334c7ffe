"""Expected latency for the load: the Huber fit, its clamps, the load allowance, and both residual tests."""

import dataclasses
import math
import random

import pytest

from analysis.latency_model import ExpectedLatency, Row, exceed_count

BUCKETS = ((0.1, 10.0), (0.2, 10.0), (math.inf, 2.0))


def test_exceed_count_interpolates_inside_the_straddling_bucket():
    assert exceed_count(BUCKETS, 0.15) == pytest.approx(5 + 2)
    assert exceed_count(BUCKETS, 0.05) == pytest.approx(5 + 10 + 2)
    assert exceed_count(BUCKETS, 0.2) == pytest.approx(2)
    assert exceed_count(BUCKETS, 5.0) == pytest.approx(2)  # beyond the last bound: +Inf requests still exceed
    assert exceed_count((), 0.1) == 0


def rows(slope: float, rates=(1, 2, 3, 4, 5, 6, 7, 8) * 3, tpr: float = 32.0, noise: float = 0.0, seed: int = 1):
    rng = random.Random(seed)
    out = []
    for r in rates:
        mean = 0.1 * (r / 4) ** slope * math.exp(rng.gauss(0, noise))
        n = r * 5
        out.append(Row(n=n, rate=r, tpr=tpr, mean=mean, p50=mean * 0.9, p99=mean * 2.5,
                       buckets=((mean * 0.8, n * 0.5), (mean * 1.6, n * 0.4), (math.inf, n * 0.1))))
    return out


def test_fit_recovers_the_elasticity_of_a_varied_baseline():
    m = ExpectedLatency(load_allowance=0.0).fit(rows(0.5, noise=0.02))
    assert m.coef_["mean"][0] == pytest.approx(0.5, abs=0.05)
    assert m.expected(8, 32)["mean"] == pytest.approx(0.1 * 2 ** 0.5, rel=0.05)


def test_a_falling_slope_is_clamped_to_zero_and_a_steep_one_to_max_elasticity():
    flat = ExpectedLatency(load_allowance=0.0).fit(rows(-0.7, noise=0.01))
    assert flat.coef_["mean"][0] == 0.0
    steep = ExpectedLatency(max_elasticity=2.0, load_allowance=0.0).fit(rows(3.0, noise=0.01))
    assert steep.coef_["mean"][0] == pytest.approx(2.0)
    edge = ExpectedLatency(max_elasticity=2.0, load_allowance=0.0).fit(rows(1.9, noise=0.01))
    assert edge.coef_["mean"][0] == pytest.approx(1.9, abs=0.02)


def test_fewer_than_three_windows_cannot_fit():
    with pytest.raises(ValueError, match="at least 3"):
        ExpectedLatency().fit(rows(0.0)[:2])


def test_load_allowance_raises_the_expectation_above_the_median_load_and_never_lowers_it_below():
    steady = rows(0.0, rates=(4,) * 20)
    m = ExpectedLatency(load_allowance=1.0).fit(steady)
    base = m.expected(4, 32)["mean"]
    assert m.expected(6, 32)["mean"] == pytest.approx(base * 1.5)
    assert m.expected(2, 32)["mean"] == pytest.approx(base)
    assert m.expected(4, 64)["mean"] == pytest.approx(base * 2)  # twice the tokens per request
    none = ExpectedLatency(load_allowance=0.0).fit(steady)
    assert none.expected(6, 32)["mean"] == pytest.approx(base)


def test_a_load_input_that_never_varied_gets_no_slope():
    m = ExpectedLatency(load_allowance=0.0).fit(rows(0.5, noise=0.01, tpr=32.0))
    assert m.coef_["mean"][1] == 0.0
    assert m.expected(4, 64)["mean"] == pytest.approx(m.expected(4, 32)["mean"])


def test_missing_load_inputs_are_left_out_of_the_model():
    m = ExpectedLatency().fit([Row(n=20, rate=4, tpr=None, mean=0.1, p50=None, p99=None, buckets=())] * 5)
    assert m.inputs_ == ["rate"] and set(m.coef_) == {"mean"} and m.tail_bound_ is None
    assert m.z_tail(BUCKETS, 0.1) is None
    assert m.expected(None, None)["mean"] == pytest.approx(0.1)


def test_z_mean_scale_shrinks_with_requests_and_is_floored():
    m = ExpectedLatency(min_log_scale=0.05).fit(rows(0.0, rates=(4,) * 30, noise=0.1))
    z5 = m.z_mean(0.15, 5, 0.1)
    z20 = m.z_mean(0.15, 20, 0.1)
    assert z20 == pytest.approx(2 * z5, rel=0.02)  # four times the requests: half the noise
    flat = ExpectedLatency(min_log_scale=0.05).fit(rows(0.0, rates=(4,) * 30, noise=0.0))
    assert flat.unit_scale_ == 0
    assert flat.z_mean(0.1 * math.exp(0.05), 20, 0.1) == pytest.approx(1.0)


def test_z_tail_is_near_zero_for_a_baseline_like_window_and_large_when_all_requests_are_slow():
    m = ExpectedLatency().fit(rows(0.0, rates=(4,) * 30))
    like = rows(0.0, rates=(4,))[0].buckets
    assert abs(m.z_tail(like, 0.1)) < 1.0
    slow = ((0.1, 0.0), (1.0, 0.0), (math.inf, 20.0))
    assert m.z_tail(slow, 0.1) > 8
    assert m.dispersion_ >= 1.0


def test_a_window_larger_than_the_typical_baseline_window_is_not_trusted_more():
    m = ExpectedLatency(min_log_scale=0.0).fit(rows(0.0, rates=(4,) * 30, noise=0.1))  # 20 requests per window
    assert m.typical_n_ == 20
    assert m.z_mean(0.15, 80, 0.1) == pytest.approx(m.z_mean(0.15, 20, 0.1))
    slow20 = ((0.1, 10.0), (1.0, 0.0), (math.inf, 10.0))
    slow80 = ((0.1, 40.0), (1.0, 0.0), (math.inf, 40.0))
    assert m.z_tail(slow80, 0.1) == pytest.approx(m.z_tail(slow20, 0.1))


def test_load_within_the_baseline_range_gets_no_allowance_only_beyond_its_load_quantile():
    m = ExpectedLatency(load_allowance=1.0, load_quantile=0.9).fit(rows(0.0, rates=(3, 4, 5) * 10, noise=0.01))
    base = m.expected(4, 32)["mean"]
    assert m.expected(5, 32)["mean"] == pytest.approx(base, rel=0.02)          # the p90 of the rates seen
    assert m.expected(7.5, 32)["mean"] == pytest.approx(base * 1.5, rel=0.02)  # 1.5x beyond it


def noisy_host_rows(count: int = 30, seed: int = 2) -> list[Row]:
    """A shared host: each window's requests wait for a CPU a random while (its run queue says how long)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        wait = rng.uniform(0.0, 1.0)
        mean = 0.1 + wait
        out.append(Row(n=10, rate=2.0, tpr=32.0, mean=mean, p50=mean, p99=mean * 2, buckets=((math.inf, 10),),
                       cpu_wait=wait))
    return out


def test_latency_net_of_cpu_waits_sees_what_the_host_noise_hides():
    m = ExpectedLatency().fit(noisy_host_rows())
    expected = m.expected(2.0, 32.0)["mean"]
    # +0.6 s of the server's own time with an ordinary CPU wait: lost in the gross spread, plain in the net one.
    assert m.z_mean(0.1 + 0.6 + 0.5, 10, expected) < 2
    assert m.z_net(0.1 + 0.6 + 0.5, 0.5, 10, expected) > 4
    # The same gross latency explained by waiting for a CPU is nothing new net of it.
    assert abs(m.z_net(0.9, 0.8, 10, expected)) < 1
    assert m.z_net(0.9, None, 10, expected) is None


def test_z_net_needs_min_net_rows_with_a_run_queue_and_its_scale_is_floored_at_min_net_scale():
    plain = [dataclasses.replace(r, cpu_wait=None) for r in noisy_host_rows()]
    assert ExpectedLatency(min_net_rows=6).fit(plain[:25] + noisy_host_rows()[:5]).z_net(1.0, 0.5, 10, 1.0) is None
    assert ExpectedLatency(min_net_rows=6).fit(plain[:24] + noisy_host_rows()[:6]).z_net(1.0, 0.5, 10, 1.0) is not None
    flat = [Row(n=10, rate=2.0, tpr=32.0, mean=0.5, p50=0.5, p99=1.0, buckets=((math.inf, 10),), cpu_wait=0.4)] * 30
    m = ExpectedLatency(min_net_scale=0.2).fit(flat)
    assert m.net_unit_scale_ == 0
    # Net 0.1 s of an expected 0.5 s = 0.2 units; 0.1 units more (0.05 s) is half a floored sigma.
    assert m.z_net(0.55, 0.4, 10, 0.5) == pytest.approx(0.5)
    assert ExpectedLatency(min_net_scale=0.1).fit(flat).z_net(0.55, 0.4, 10, 0.5) == pytest.approx(1.0)
