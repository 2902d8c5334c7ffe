"""Attribution: every label from its own signal, each gate at its edge, ranking, discounts and `unknown`."""

import math

import pytest

from analysis.attribution import Attributor, SignalStats
from analysis.cause_signals import BY_NAME, SIGNALS

# A quiet baseline for every signal: values at these medians move nothing.
QUIET = {"gc_pause": 0.0008, "app_wait": 0.1, "futex": 30.0, "blocked": 0.001, "syscalls": 400.0,
         "retransmits": 0.0, "runqueue": 0.3, "involuntary": 250.0, "cpu_per_token": 0.002}
STATS = {name: SignalStats(median=v, sigma=v * 0.05, count=30) for name, v in QUIET.items()}


def rank(**moved):
    return Attributor().rank({**QUIET, **moved}, STATS)


@pytest.mark.parametrize(("signal", "value", "label", "words"), [
    ("gc_pause", 0.041, "gc", "GC pause 41 ms/s vs 0.8 ms/s baseline (x41 against the 1 ms/s floor, z"),
    ("app_wait", 0.6, "lock", "threads waiting inside their own code 0.6 threads vs 0.1 threads baseline (x6"),
    ("blocked", 0.5, "blocked", "off-CPU in sleep, disk I/O, stopped or other waits 0.5 s/s"),
    ("syscalls", 50000.0, "syscalls", "syscalls per request 50,000 /req vs 400 /req baseline (x125"),
    ("retransmits", 10.0, "network", "TCP retransmits 10 /s vs 0 /s baseline (x50 against the 0.2 /s floor"),
    ("runqueue", 3.0, "cpu_contention", "run-queue wait per CPU second 3 s/s vs 0.3 s/s baseline (x10"),
    ("involuntary", 470.0, "cpu_contention",
     "involuntary context switches per CPU second 470 /CPU s vs 250 /CPU s baseline (x1.88"),
    ("cpu_per_token", 0.006, "compute", "CPU per token 6 ms/token vs 2 ms/token baseline (x3"),
])
def test_each_label_from_its_signal_with_evidence_in_words_and_numbers(signal, value, label, words):
    causes = rank(**{signal: value})
    assert [c.label for c in causes] == [label]
    assert causes[0].evidence.startswith(words)
    assert causes[0].value == value and causes[0].baseline == QUIET[signal]


def test_lock_from_futex_when_python_stacks_are_missing():
    values = {**QUIET, "app_wait": None, "futex": 1.2}
    stats = {**STATS, "futex": SignalStats(0.2, 0.02, 30)}
    assert Attributor().rank(values, stats)[0].label == "lock"


def test_the_ranking_puts_the_largest_move_first():
    causes = rank(gc_pause=0.08, syscalls=900.0)
    assert [c.label for c in causes] == ["gc", "syscalls"]
    assert causes[0].score > causes[1].score > 0


def test_min_change_edge():
    stats = {"gc_pause": SignalStats(0.0, 0.0, 30)}
    a = Attributor()
    assert a.rank({"gc_pause": 0.005}, stats)[0].label == "gc"        # exactly min_change (5 ms/s)
    assert a.rank({"gc_pause": 0.0049}, stats)[0].label == "unknown"  # just below


def test_z_edge():
    stats = {"runqueue": SignalStats(1.0, 1.0, 30)}
    a = Attributor(min_z=3.0)
    assert a.rank({"runqueue": 4.0}, stats)[0].label == "cpu_contention"  # z = 3.0
    assert a.rank({"runqueue": 3.99}, stats)[0].label == "unknown"


def test_ratio_edge_and_the_floor_that_keeps_tiny_baselines_from_huge_ratios():
    stats = {"syscalls": SignalStats(1000.0, 10.0, 30)}
    a = Attributor(min_ratio=1.5)
    assert a.rank({"syscalls": 1500.0}, stats)[0].label == "syscalls"
    assert a.rank({"syscalls": 1499.0}, stats)[0].label == "unknown"
    # A retransmit baseline of 0 is floored at 0.2/s: 10/s reads x50, not infinity.
    c = a.rank({"retransmits": 10.0}, {"retransmits": SignalStats(0.0, 0.0, 30)})[0]
    assert c.score == pytest.approx(5.6439, abs=1e-3)


def test_a_sigma_of_zero_is_floored_so_a_flat_baseline_needs_a_real_change():
    # futex min_change 0.3 s/s: sigma floor 0.075; +0.2 s/s is below min_change whatever the z.
    stats = {"futex": SignalStats(0.2, 0.0, 30)}
    assert Attributor().rank({"futex": 0.4}, stats)[0].label == "unknown"


def test_compute_is_weighted_below_a_specific_cause_of_the_same_ratio():
    causes = rank(cpu_per_token=0.008, gc_pause=0.0032 * 2)
    assert causes[0].label == "gc"
    compute = next(c for c in causes if c.label == "compute")
    assert compute.score == pytest.approx(0.5 * 2.0)  # x4 ratio, log2 4 = 2, weight 0.5


def test_waiting_in_own_code_is_not_a_lock_when_the_kernel_says_the_waits_are_sleeps_or_disk():
    alone = rank(app_wait=0.8)
    both = rank(app_wait=0.8, blocked=0.5)
    assert alone[0].label == "lock"
    lock_alone = alone[0].score
    lock_both = next(c for c in both if c.label == "lock").score
    assert lock_both == pytest.approx(lock_alone * 0.5)
    assert both[0].label == "blocked"


def test_profile_shift_names_compute_and_its_edge():
    jstats = SignalStats(0.05, 0.01, 30)
    causes = Attributor().rank(QUIET, STATS, jsd=0.3, jsd_stats=jstats)
    assert causes[0].label == "compute" and "Jensen-Shannon" in causes[0].evidence
    below = Attributor(profile_min_jsd=0.1).rank(QUIET, STATS, jsd=0.099, jsd_stats=SignalStats(0.01, 0.001, 30))
    assert below[0].label == "unknown"
    # CPU per token and profile shift both moved: one compute cause carrying both pieces of evidence.
    both = Attributor().rank({**QUIET, "cpu_per_token": 0.006}, STATS, jsd=0.3, jsd_stats=jstats)
    assert [c.label for c in both] == ["compute"] and "CPU per token" in both[0].evidence


def test_unknown_when_nothing_moved_names_what_was_not_measured():
    causes = Attributor().rank(QUIET, STATS, not_measured={"gc": "gc: uprobe failed"})
    assert [c.label for c in causes] == ["unknown"]
    assert causes[0].score == 0 and "not measured: gc: gc: uprobe failed" in causes[0].evidence


def test_a_signal_without_a_baseline_or_value_is_not_a_cause():
    assert Attributor().rank({"gc_pause": 1.0}, {"gc_pause": None})[0].label == "unknown"
    assert Attributor().rank({"gc_pause": None}, STATS)[0].label == "unknown"


def test_every_signal_has_a_known_label_and_positive_floors():
    from analysis.regression import DETECTOR_CAUSES
    # `down` (AGENT_CAUSES) is a fact the agent states, not a signal the detector ranks.
    assert {s.label for s in SIGNALS} == set(DETECTOR_CAUSES) - {"unknown"}
    assert all(s.floor > 0 and s.min_change > 0 for s in SIGNALS)
    assert BY_NAME["gc_pause"].unit == "ms/s"


def test_run_queue_growth_with_more_cpu_per_token_is_compute_not_contention():
    alone = rank(runqueue=3.0)  # x10 run-queue wait per CPU second, CPU per token unchanged: contention
    assert alone[0].label == "cpu_contention" and alone[0].score == pytest.approx(math.log2(10), abs=1e-3)
    # The same run-queue growth with x4 CPU per token: only the growth beyond x4 (log2 10 - log2 4) is contention.
    both = rank(runqueue=3.0, cpu_per_token=0.008)
    contention = next(c for c in both if c.label == "cpu_contention")
    assert contention.score == pytest.approx(math.log2(10) - 2.0, abs=1e-3)
    assert "less CPU per token x4" in contention.evidence
    # Edge: run-queue growth no larger than the CPU-per-token growth leaves no contention, and compute ranks first.
    even = rank(runqueue=1.2, cpu_per_token=0.008)
    assert even[0].label == "compute"
    assert next(c for c in even if c.label == "cpu_contention").score == pytest.approx(0.0, abs=1e-3)
    # Contention leads again once its residual beats compute's weighted score (0.5 * log2 4 = 1): past x8 run queue.
    assert rank(runqueue=2.3, cpu_per_token=0.008)[0].label == "compute"
    assert rank(runqueue=2.5, cpu_per_token=0.008)[0].label == "cpu_contention"


# -- persistence: a move too small for one window, shown by lasting --------------------------------------------------

QUIET_HIGH = {name: SignalStats(median=v, sigma=v * 0.05, count=30, high=v * 1.1) for name, v in QUIET.items()}


def persistent(values, min_windows=5, change_fraction=0.1, min_z=6.0, stats=QUIET_HIGH):
    samples = [{**QUIET, "runqueue": v} for v in values]
    return Attributor().rank_persistent(samples, stats, min_windows, change_fraction, min_z)


def test_a_small_move_in_nearly_every_window_is_named_with_its_count():
    # 0.4 s/s against 0.3: below runqueue's 0.5 s/s min_change, so no single window names it.
    assert rank(runqueue=0.45)[0].label == "unknown"
    causes = persistent([0.45, 0.46, 0.3, 0.47, 0.45, 0.46])
    assert causes[0].label == "cpu_contention"
    assert causes[0].evidence.startswith("run-queue wait per CPU second 0.455 s/s vs 0.3 s/s baseline (x1.52")
    assert causes[0].evidence.endswith("above the baseline's usual high (0.33 s/s) in 5 of 6 windows")


@pytest.mark.parametrize(("values", "why"), [
    ([0.45, 0.46, 0.3, 0.47, 0.3, 0.46], "above the high quantile in only 4 of 6"),
    ([0.34, 0.34, 0.34, 0.34, 0.34, 0.34], "above the high quantile but less than change_fraction of min_change"),
    ([0.44, 0.44, 0.44, 0.44, 0.44, 0.44], "median ratio 1.47, under min_ratio 1.5"),
])
def test_a_persistence_that_fails_one_gate_names_nothing(values, why):
    assert persistent(values)[0].label == "unknown", why


def test_persistence_on_a_baseline_too_noisy_to_tell_names_nothing():
    noisy = {**QUIET_HIGH, "runqueue": SignalStats(median=0.3, sigma=0.1, count=30, high=0.33)}
    values = [0.6] * 6  # x2, persistent, but only 3 of the baseline's sigmas above its median
    assert persistent(values, stats=noisy)[0].label == "unknown"
    assert persistent(values, stats=noisy, min_z=2.9)[0].label == "cpu_contention"


def test_persistence_needs_the_high_quantile_of_the_baseline():
    no_high = {**QUIET_HIGH, "runqueue": SignalStats(median=0.3, sigma=0.015, count=30)}
    assert persistent([0.6] * 6, stats=no_high)[0].label == "unknown"


def test_involuntary_switches_are_read_per_cpu_second_so_more_load_is_not_contention():
    from analysis.cause_signals import read_all
    from analysis.features import Features

    def involuntary(cpu: float, switches: float) -> float | None:
        return read_all(Features(duration=5.0, cpu_per_second=cpu, involuntary_switches_per_second=switches))["involuntary"]

    # Measured here (all threads): 64/s at 0.25 core, 168/s at 0.58 core, 120/s at 0.25 core under a CPU hog.
    assert involuntary(0.25, 64.0) == pytest.approx(256.0)
    assert involuntary(0.58, 168.0) == pytest.approx(289.7, abs=0.1)
    assert involuntary(0.25, 120.0) == pytest.approx(480.0)
    assert involuntary(0.0, 3.0) == pytest.approx(60.0)  # an idle server: the 0.05-core floor, not 3 / 0
    assert involuntary(None, 3.0) is None and involuntary(0.3, None) is None
    stats = {"involuntary": SignalStats(256.0, 20.0, 30)}
    assert Attributor().rank({"involuntary": 289.7}, stats)[0].label == "unknown"  # +50% load
    assert Attributor().rank({"involuntary": 480.0}, stats)[0].label == "cpu_contention"
