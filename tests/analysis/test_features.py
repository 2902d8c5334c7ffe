"""Features of one window: units, per-request and per-token normalisation, and None for what was not measured."""

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.features import extract, is_idle_loop
from analysis.window import LatencyReading, StackReading, Window
from tests.analysis import synth

FIXTURE = Path(__file__).parent / "fixtures" / "windows_faults.jsonl.gz"
SECTIONS = ("syscalls", "offcpu", "gc", "tcp", "runqueue", "process", "stacks", "latency")


def test_units_and_normalisation():
    w = synth.window(3, synth.Load(gc_pause=0.02, retransmits=10, syscalls_per_request=500))
    f = extract(w)
    n = w.latency.requests
    assert f.duration == 5.0 and f.requests == n
    assert f.gc_pause_per_second == pytest.approx(w.gc.pause_seconds / 5)
    assert f.retransmits_per_second == pytest.approx(2.0)
    assert f.syscalls_per_request == pytest.approx(sum(w.syscalls.counts.values()) / n)
    assert f.tokens_per_request == pytest.approx(32.0)
    assert f.cpu_per_token == pytest.approx(w.process.cpu_seconds / (32 * n))
    assert f.offcpu["futex"] > 25 and f.offcpu["stopped"] == 0
    assert f.buckets[-1][0] == float("inf") and sum(c for _, c in f.buckets) == n


def test_every_missing_section_gives_none_never_zero():
    w = synth.strip(synth.window(0), *SECTIONS)
    f = extract(w)
    for name in ("requests", "mean_seconds", "syscalls_per_second", "syscalls_per_request", "offcpu",
                 "gc_pause_per_second", "retransmits_per_second", "runqueue_per_second", "cpu_per_second",
                 "cpu_per_token", "app_wait_threads", "tokens_per_second", "stuck_threads"):
        assert getattr(f, name) is None, name
    assert f.latency_unanswered is False  # a source that failed is not a server that did not answer


def test_stuck_threads_are_the_stopped_and_disk_waiting_ones_and_unmeasured_in_old_windows():
    w = synth.window(0)
    f = extract(replace(w, process=replace(w.process, stopped_threads=3, disk_wait_threads=1)))
    assert f.stuck_threads == 4.0
    # A window recorded before these were read has None for them: not measured, not zero.
    old = replace(w, process=replace(w.process, stopped_threads=None, disk_wait_threads=None))
    assert extract(old).stuck_threads is None


def test_an_unanswered_latency_endpoint_is_unknown_requests_and_says_so():
    f = extract(synth.unanswered(synth.window(0)))
    assert f.latency_unanswered is True and f.requests is None and f.mean_seconds is None
    assert f.latency_unreachable == 0.0  # it connected
    assert extract(synth.unanswered(synth.window(0), connect=True)).latency_unreachable == 1.0
    assert extract(synth.window(0)).latency_unreachable == 0.0
    # No latency source at all, or one that failed otherwise: whether the port is reachable was not measured.
    assert extract(replace(synth.window(0), latency=None)).latency_unreachable is None
    assert extract(synth.strip(synth.window(0), "latency")).latency_unreachable is None


def test_no_finished_request_means_no_latency_and_no_per_request_figures():
    w = synth.window(0)
    w = replace(w, latency=LatencyReading(requests=0.0, request_rate=0.0, tokens_per_second=0.0))
    f = extract(w)
    assert f.requests == 0 and f.mean_seconds is None and f.p99_seconds is None and f.buckets == ()
    assert f.syscalls_per_request is None and f.tokens_per_request is None and f.cpu_per_token is None
    assert f.syscalls_per_second is not None


def test_a_server_without_token_counts_has_no_cpu_per_token():
    w = synth.window(0)
    w = replace(w, latency=replace(w.latency, tokens_per_second=None))
    f = extract(w)
    assert f.tokens_per_second is None and f.cpu_per_token is None and f.cpu_per_second is not None


def test_a_bucket_bound_that_is_not_a_number_is_left_out():
    w = synth.window(0)
    w = replace(w, latency=replace(w.latency, buckets={"0.1": 3.0, "bogus": 2.0, "+Inf": 1.0}))
    assert extract(w).buckets == ((0.1, 3.0), (float("inf"), 1.0))


def test_app_wait_counts_idle_samples_outside_idle_loops_per_tick():
    idle = {"a;Condition.wait (threading.py:295)": 490, "a;poll (waitress/wasyncore.py:145)": 245,
            "a;Scheduler.step (app/scheduler.py:80)": 49}
    w = replace(synth.window(0), stacks=StackReading(idle=idle, rate_hz=49.0, samples=245))
    assert extract(w).app_wait_threads == pytest.approx(49 / 245)
    assert is_idle_loop("Condition.wait (threading.py:295)") and not is_idle_loop("step (app/scheduler.py:80)")


def test_no_sampling_ticks_leaves_app_wait_unmeasured():
    w = replace(synth.window(0), stacks=StackReading(idle={"x": 3}, rate_hz=0.0, samples=0))
    assert extract(w).app_wait_threads is None


def test_a_window_without_length_is_one_clear_error():
    with pytest.raises(ValueError, match="no duration"):
        extract(Window(target="t", pid=1, start=10.0, end=10.0))


def test_real_lock_fault_window_has_more_threads_waiting_in_own_code_than_a_normal_one():
    rows = [Window.from_dict(json.loads(line)) for line in gzip.open(FIXTURE, "rt")]
    labels = [json.loads(line)["_label"] for line in gzip.open(FIXTURE, "rt")]
    normal = [extract(w).app_wait_threads for w, lab in zip(rows, labels) if lab == "normal"][:5]
    lock = [extract(w).app_wait_threads for w, lab in zip(rows, labels) if lab == "lock"][1:]
    assert min(lock) > 2 * max(normal)


def test_a_signal_that_is_not_a_finite_number_is_unmeasured():
    from analysis.cause_signals import read_all
    f = extract(replace(synth.window(0), gc=replace(synth.window(0).gc, pause_seconds=float("nan"))))
    assert read_all(f)["gc_pause"] is None and read_all(f)["syscalls"] is not None


def test_pressure_is_per_second_and_none_where_the_kernel_has_none():
    from analysis.window import PressureReading

    w = synth.window(3)
    assert extract(w).pressure is None and extract(w).major_faults_per_second is None  # an older recording
    w.pressure = PressureReading(host={"io": {"some": 2.5, "full": 1.0}}, cgroup=None, major_faults=10,
                                 reasons={"cgroup": "no cgroup pressure"})
    f = extract(w)
    assert f.host_pressure == {"io_some": 2.5 / w.duration, "io_full": 1.0 / w.duration}
    assert f.pressure is None and f.major_faults_per_second == pytest.approx(10 / w.duration)
