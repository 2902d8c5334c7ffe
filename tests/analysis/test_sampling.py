"""Signals read from py-spy's ticks are judged against the sampling noise of the ticks they were read from."""

import math

import numpy as np
import pytest

from analysis.attribution import Attributor, SignalStats
from analysis.cause_signals import BY_NAME
from analysis.profile import jensen_shannon
from analysis.sampling import beyond_noise, counts, jsd_noise, noise_sigma, poisson_sf, pooled

APP_WAIT = BY_NAME["app_wait"]
# A quiet server's lock signal: most recordings count no wait inside its own code (median and MAD 0), a few 1-4.
SPARSE = SignalStats(median=0.0, sigma=0.0, count=22, high=0.076, mean=0.024)


def test_poisson_tail_is_exact() -> None:
    mu = 0.45
    assert poisson_sf(3, mu) == pytest.approx(1 - math.exp(-mu) * (1 + mu + mu * mu / 2), rel=1e-9)
    assert poisson_sf(0, mu) == 1.0 and poisson_sf(2, 0.0) == 0.0
    assert poisson_sf(2.4, mu) == poisson_sf(3, mu)  # a pooled count that is not whole is rounded up
    assert poisson_sf(40, 10.0) == pytest.approx(1.5e-12, rel=0.05)


def test_the_same_share_is_noise_at_few_ticks_and_evidence_at_many() -> None:
    # 0.2 threads: 3 waits in 15 ticks (1 Hz over 15 s) against 9 in 45 (3 Hz).
    assert not beyond_noise(3, 15, SPARSE.mean, 3.0)
    assert beyond_noise(9, 45, SPARSE.mean, 3.0)
    assert noise_sigma(SPARSE.mean, 15) == pytest.approx(math.sqrt(3) * noise_sigma(SPARSE.mean, 45))


def test_moved_judges_a_per_tick_signal_at_its_ticks() -> None:
    a = Attributor()
    # Without ticks the gates are the ones they were (a family's sum, an older state).
    assert a.moved(APP_WAIT, 0.2, SPARSE) is not None
    assert a.moved(APP_WAIT, 0.2, SPARSE, (9.0, 45.0, 1)) is not None
    assert a.moved(APP_WAIT, 0.2, SPARSE, (3.0, 15.0, 1)) is None
    # A lock holding a third of a thread is seen at 1 Hz too.
    assert a.moved(APP_WAIT, 0.4, SPARSE, (6.0, 15.0, 1)) is not None
    # Only per-tick signals: a signal of another kind ignores ticks.
    gc = BY_NAME["gc_pause"]
    assert a.moved(gc, 0.05, SignalStats(0.0, 0.0, 20, 0.001, 0.0005), (1.0, 15.0, 1)) is not None


def test_windows_carrying_one_recording_are_one_measurement() -> None:
    one = {"app_wait": 0.2, "app_wait_ticks": 15.0, "stacks_from": 10.0}
    two = {"app_wait": 0.25, "app_wait_ticks": 16.0, "stacks_from": 25.0}
    assert pooled("app_wait", [one, one, one, two, two]) == (pytest.approx(7.0), 31.0, 2)
    assert pooled("app_wait", [{"app_wait": 0.2}]) is None and counts("app_wait", {"app_wait": 0.2}) is None
    # Pooled by the detector over a run (events and recordings given): read back as given.
    assert counts("app_wait", {"app_wait": 0.2, "app_wait_ticks": 31.0, "app_wait_events": 7.0,
                               "app_wait_recordings": 2}) == (7.0, 31.0, 2)


def test_persistence_of_two_thin_recordings_is_not_a_sustained_lock() -> None:
    # Session 20's 1 Hz false alarm: two recordings of healthy traffic (3 of 17 and 4 of 15 ticks) carried over six
    # windows read "above the usual high in 5 of 6 windows", z 35 against a MAD of 0.
    a = Attributor()
    thin = [{"app_wait": None}] + [{"app_wait": 3 / 17, "app_wait_ticks": 17.0, "stacks_from": 1.0}] * 3 + \
        [{"app_wait": 4 / 15, "app_wait_ticks": 15.0, "stacks_from": 2.0}] * 2
    xs = [s["app_wait"] for s in thin]
    assert a.persistent(APP_WAIT, xs, SPARSE, 5, 0.1, 6.0) is not None  # without ticks: as before
    assert a.persistent(APP_WAIT, xs, SPARSE, 5, 0.1, 6.0, pooled("app_wait", thin)) is None
    # The same share over six recordings of 45 ticks each (8 waits each) is a lock that persisted.
    thick = [{"app_wait": 8 / 45, "app_wait_ticks": 45.0, "stacks_from": float(i)} for i in range(6)]
    got = a.persistent(APP_WAIT, [s["app_wait"] for s in thick], SPARSE, 5, 0.1, 6.0, pooled("app_wait", thick))
    assert got is not None and got[1] == 6


def test_naming_an_open_episode_judges_a_persistent_count_by_its_pooled_tail() -> None:
    # To open on persistence, one recording's sampling spread floors the z gate (above). To name an episode its
    # latency opened, the count pooled over the distinct recordings is judged by its Poisson tail alone: a lock of a
    # few waits per recording shows by persisting over recordings, which one recording's spread at z 6 never allows.
    a = Attributor()
    thin = [{"app_wait": 3 / 17, "app_wait_ticks": 17.0, "stacks_from": 1.0}] * 3 + \
        [{"app_wait": 4 / 15, "app_wait_ticks": 15.0, "stacks_from": 2.0}] * 3
    xs = [s["app_wait"] for s in thin]
    assert a.persistent(APP_WAIT, xs, SPARSE, 5, 0.1, 6.0, pooled("app_wait", thin)) is None
    got = a.persistent(APP_WAIT, xs, SPARSE, 5, 0.1, 6.0, pooled("app_wait", thin), noise_floor=False)
    assert got is not None and got[1] == 6
    # Within the pooled count's noise it names nothing either way: 2 waits in each of two 14-tick recordings.
    few = [{"app_wait": 2 / 14, "app_wait_ticks": 14.0, "stacks_from": float(i // 3)} for i in range(6)]
    assert a.persistent(APP_WAIT, [s["app_wait"] for s in few], SPARSE, 5, 0.1, 6.0, pooled("app_wait", few),
                        noise_floor=False) is None
    assert a.rank_persistent(few, {"app_wait": SPARSE}, 5, 0.1, 6.0, noise_floor=False)[0].label == "unknown"
    assert a.rank_persistent(thin, {"app_wait": SPARSE}, 5, 0.1, 6.0, noise_floor=False)[0].label == "lock"
    assert a.rank_persistent(thin, {"app_wait": SPARSE}, 5, 0.1, 6.0)[0].label == "unknown"


def test_a_profile_shift_of_a_few_samples_is_within_noise() -> None:
    rng = np.random.default_rng(0)
    profile = {f"f{i}": float(w) for i, w in enumerate(rng.pareto(1.0, 40) + 1)}
    noise = {n: jsd_noise(profile, n, 3.0) for n in (1, 3, 10, 100)}
    assert noise[1] > noise[3] > noise[10] > noise[100]
    assert jsd_noise(profile, 3, 3.0) == noise[3]  # seeded: the same answer every time
    # Two samples on two of the profile's functions read a large shift, and one within noise.
    two = sorted(profile, key=profile.get)[-3:-1]
    shift = jensen_shannon(profile, {k: 1.0 for k in two})
    assert shift > 0.5 and shift < jsd_noise(profile, 2, 3.0) <= 1.0
    # A hundred samples all on one rare function are a shift far beyond it.
    rare = min(profile, key=profile.get)
    assert jensen_shannon(profile, {rare: 100.0}) > noise[100]
    assert jsd_noise({}, 3, 3.0) is None and jsd_noise(profile, 0, 3.0) is None


def test_attribution_drops_a_profile_shift_within_its_noise() -> None:
    a = Attributor()
    stats = SignalStats(0.3, 0.05, 20, 0.4, 0.3)
    assert "compute" in {c.label for c in a.rank({}, {}, 0.9, stats)}
    assert a.rank({}, {}, 0.9, stats, jsd_noise=lambda: 0.95)[0].label == "unknown"
    assert "compute" in {c.label for c in a.rank({}, {}, 0.9, stats, jsd_noise=lambda: 0.5)}


def test_a_shift_onto_new_functions_is_noise_where_healthy_samples_often_land_on_new_ones() -> None:
    profile = {f"f{i}": 10.0 - i for i in range(8)}
    two_new = jensen_shannon(profile, {"x": 1.0, "y": 1.0})
    assert two_new == pytest.approx(1.0)
    # A profile that healthy traffic never surprised: two samples on new functions are a shift.
    assert two_new > jsd_noise(profile, 2, 3.0, unseen=0.0)
    # One learnt from so few samples that a third of healthy samples fell on functions it lacked: they are not.
    assert jsd_noise(profile, 2, 3.0, unseen=0.3) == 1.0
    # Forty samples all on new functions are a shift whatever the profile's surprises.
    assert jensen_shannon(profile, {f"n{i}": 1.0 for i in range(40)}) > jsd_noise(profile, 40, 3.0, unseen=0.3)


def test_the_baseline_counts_healthy_samples_on_functions_it_did_not_hold() -> None:
    from analysis.baseline import Baseline

    b = Baseline(10, profile_decay=1.0)
    b.add_row(_row(), {"a": 4.0})
    assert b.unseen == 0.0  # the first window: nothing to be new to
    b.add_row(_row(), {"a": 3.0, "b": 1.0})
    assert b.unseen == pytest.approx(0.25)
    b.add_row(_row(), {"a": 3.0, "b": 1.0})
    assert b.unseen == pytest.approx(0.125)
    restored = Baseline(10, profile_decay=1.0)
    restored.load(b.to_dict())
    assert restored.unseen == pytest.approx(0.125)
    restored.load({"rows": [], "profile": {"a": 1.0}})  # an older state: no count, as before
    assert restored.unseen == 0.0


def _row():
    from analysis.baseline import BaselineRow
    from analysis.latency_model import Row

    return BaselineRow(start=0.0, end=5.0, latency=Row(n=10.0, rate=2.0, tpr=None, mean=0.1, p50=0.1, p99=0.2,
                                                        buckets=(), cpu_wait=None))


def test_the_detector_judges_sampling_noise_only_when_asked() -> None:
    from analysis.detector import LatencyDetector
    from tests.analysis import synth

    for noise in (False, True):
        det = LatencyDetector(sampling_noise=noise)
        for w in synth.windows(0, 40, seed=1):
            det.update(w)
        assert ("app_wait_ticks" in det.recent_[-1]) is noise and ("stacks_from" in det.recent_[-1]) is noise
