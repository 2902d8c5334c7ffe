"""Knee finding and bottleneck naming on synthetic step data, each threshold tested at its edge."""

import pytest

from analysis.capacity import (
    BATCH_FULL_SATURATED,
    BLOCKED_OFFCPU_SATURATED,
    GC_FREQUENT_PER_S,
    GC_PAUSE_SATURATED,
    MIN_RETRANSMITS,
    RETRANSMITS_PER_REQUEST_SATURATED,
    THREAD_CPU_SATURATED,
    Slo,
    StepFigures,
    find_knee,
    name_bottleneck,
    verdict,
)

SLO = Slo(p95_s=1.0, max_error_rate=0.01)


def step(index: int, rate: float, p95: float = 0.2, errors: dict | None = None, sent: int = 100,
         **kw) -> StepFigures:
    ok = sent - sum((errors or {}).values())
    return StepFigures(index=index, offered_rps=rate, planned_s=10, duration_s=10, sent=sent, ok=ok,
                       achieved_rps=ok / 10, tokens_per_s=ok * 3.2, errors=errors or {}, client_p95_s=p95, **kw)


@pytest.mark.parametrize("p95, rate", [(0.0, 0.01), (-1.0, 0.01), (1.0, -0.1), (1.0, 1.0)])
def test_slo_rejects_zero_latency_and_bad_error_rate(p95, rate):
    with pytest.raises(ValueError, match="must be"):
        Slo(p95, rate)


def test_verdict_names_what_broke():
    assert verdict(step(0, 2), SLO) is None
    assert "p95 1500 ms > SLO 1000 ms" in verdict(step(0, 2, p95=1.5), SLO)
    assert "error rate 5.0%" in verdict(step(0, 2, errors={"429": 5}), SLO)
    assert "no request completed" in verdict(step(0, 2, errors={"timeout": 100}), SLO)


def test_verdict_edges_are_inclusive():
    assert verdict(step(0, 2, p95=1.0), SLO) is None
    assert verdict(step(0, 2, errors={"5xx": 1}), SLO) is None  # 1 % is allowed
    assert verdict(step(0, 2, errors={"5xx": 2}), SLO) is not None


def test_knee_is_the_step_before_the_first_failure():
    steps = [step(0, 2), step(1, 4), step(2, 8, p95=1.4), step(3, 12, p95=3.0)]
    knee = find_knee(steps, SLO)
    assert (knee.last_good, knee.first_bad, knee.found) == (1, 2, True)
    assert "p95 1400 ms" in knee.reason


def test_knee_ignores_repeats_and_schedule_order():
    steps = [step(0, 8, p95=2.0), step(1, 2), step(2, 4), step(3, 8, p95=0.1, repeat_of=0)]
    knee = find_knee(steps, SLO)
    assert (knee.last_good, knee.first_bad) == (2, 0)


def test_no_knee_when_lowest_fails_or_nothing_fails():
    low = find_knee([step(0, 2, p95=3.0), step(1, 4)], SLO)
    assert (low.last_good, low.first_bad, low.found) == (None, 0, False)
    assert "lowest step (2 req/s) already fails" in low.reason
    high = find_knee([step(0, 2), step(1, 4)], SLO)
    assert (high.last_good, high.first_bad) == (1, None) and "raise the schedule" in high.reason


def test_cpu_bound_server_names_the_busiest_thread():
    good = step(0, 8, busiest_thread_cores=0.7, queue_waiting_mean=0.3, cpu_cores=0.8, host_cpus=4,
                runq_wait_per_s=0.02, busiest_thread_offcpu_share=0.3)
    bad = step(1, 12, p95=2.0, busiest_thread_cores=0.98, queue_waiting_mean=9.0, cpu_cores=1.1, host_cpus=4,
               runq_wait_per_s=0.05, busiest_thread_offcpu_share=0.02)
    b = name_bottleneck(good, bad)
    assert b.resource == "CPU of the busiest thread"
    assert "busiest thread CPU 0.7 -> 0.98 cores" in b.summary


def test_gc_fault_is_named_over_cpu():
    bad = step(1, 4, p95=2.0, busiest_thread_cores=0.95, gc_pause_share=0.30, gc_collections_per_s=900)
    b = name_bottleneck(step(0, 2, gc_pause_share=0.2), bad)
    assert b.resource == "GC"
    assert "GC pause share of wall time 0.2 -> 0.3" in b.summary


def test_queue_bound_with_429s():
    bad = step(1, 20, errors={"429": 30}, queue_waiting_max=64.0)
    assert name_bottleneck(step(0, 10), bad).resource == "queue bound"


def test_run_queue_contention_is_relative_to_cpu_used():
    bad = step(1, 8, p95=2.0, cpu_cores=0.3, runq_wait_per_s=0.6, busiest_thread_cores=0.28)
    assert name_bottleneck(step(0, 4), bad).resource == "CPU contention (run queue)"
    busy = step(1, 8, p95=2.0, cpu_cores=1.5, runq_wait_per_s=0.6, busiest_thread_cores=0.5)
    assert name_bottleneck(step(0, 4), busy).resource is None  # 0.4 s waiting per CPU second: not saturated


def test_lock_needs_queued_work_while_the_thread_is_off_cpu():
    blocked = step(1, 4, p95=2.0, busiest_thread_cores=0.3, busiest_thread_offcpu_share=0.7,
                   queue_waiting_mean=6.0, offcpu_by_kind={"lock (futex)": 20.0})
    assert name_bottleneck(step(0, 2), blocked).resource == "lock / blocking wait"
    idle = step(1, 4, p95=2.0, busiest_thread_cores=0.3, busiest_thread_offcpu_share=0.7, queue_waiting_mean=0.2)
    assert name_bottleneck(step(0, 2), idle).resource is None


def test_a_full_batch_with_requests_waiting_names_the_batch_size():
    good = step(0, 2, batch_mean=2.5, max_batch=4, queue_waiting_mean=0.1, busiest_thread_cores=0.5)
    bad = step(1, 4, p95=2.0, batch_mean=3.9, max_batch=4, queue_waiting_mean=7.0, busiest_thread_cores=0.6)
    b = name_bottleneck(good, bad)
    assert b.resource == "batch size"
    assert "mean batch / max batch 0.625 -> 0.975 share (saturated at 0.9)" in b.summary


@pytest.mark.parametrize("fill, named", [(BATCH_FULL_SATURATED, True), (BATCH_FULL_SATURATED - 0.01, False)])
def test_batch_fill_threshold_edge(fill, named):
    bad = step(1, 4, p95=2.0, batch_mean=fill * 8, max_batch=8, queue_waiting_mean=3.0)
    assert (name_bottleneck(step(0, 2), bad).resource == "batch size") is named


@pytest.mark.parametrize("what", ["no queue", "limit unknown"])
def test_a_full_batch_is_not_the_bottleneck_without_a_queue_or_a_known_limit(what):
    kw = {"no queue": dict(max_batch=4, queue_waiting_mean=0.5), "limit unknown": dict(queue_waiting_mean=6.0)}[what]
    b = name_bottleneck(step(0, 2), step(1, 4, p95=2.0, batch_mean=4.0, **kw))
    batch = next(c for c in b.candidates if c.resource == "batch size")
    assert batch.score == 0 and b.resource is None


def test_two_retransmits_in_a_short_step_do_not_name_the_network():
    # The audit's loopback run: 2 retransmits in 27 requests is 0.074 per request, above the rate line.
    b = name_bottleneck(step(0, 1, sent=7, retransmits=0), step(1, 2, p95=2.1, sent=27, retransmits=2))
    net = next(c for c in b.candidates if c.resource == "network (retransmits)")
    assert net.score == pytest.approx(2 / MIN_RETRANSMITS) and b.resource is None
    assert any(e.figure == "TCP retransmits in the step" and e.bad == 2 for e in net.evidence)


@pytest.mark.parametrize("count, sent, named", [
    (MIN_RETRANSMITS, 100, True),  # 5 in 100: both lines reached
    (MIN_RETRANSMITS - 1, 40, False),  # 0.1 per request, but only 4
    (MIN_RETRANSMITS + 1, 200, False),  # 6, but 0.03 per request
])
def test_retransmits_need_both_a_count_and_a_rate(count, sent, named):
    assert RETRANSMITS_PER_REQUEST_SATURATED == 0.05
    b = name_bottleneck(step(0, 2, retransmits=0), step(1, 4, p95=2.0, sent=sent, retransmits=count))
    assert (b.resource == "network (retransmits)") is named


@pytest.mark.parametrize("value, named", [(THREAD_CPU_SATURATED, True), (THREAD_CPU_SATURATED - 0.01, False)])
def test_thread_cpu_threshold_edge(value, named):
    b = name_bottleneck(step(0, 2), step(1, 4, p95=2.0, busiest_thread_cores=value))
    assert (b.resource == "CPU of the busiest thread") is named


@pytest.mark.parametrize("value, named", [(GC_PAUSE_SATURATED, True), (GC_PAUSE_SATURATED * 0.9, False)])
def test_gc_threshold_edge(value, named):
    b = name_bottleneck(step(0, 2), step(1, 4, p95=2.0, gc_pause_share=value))
    assert (b.resource == "GC") is named


@pytest.mark.parametrize("value, named", [(BLOCKED_OFFCPU_SATURATED, True), (BLOCKED_OFFCPU_SATURATED - 0.01, False)])
def test_blocked_threshold_edge(value, named):
    b = name_bottleneck(step(0, 2), step(1, 4, p95=2.0, busiest_thread_offcpu_share=value, queue_waiting_mean=1.0))
    assert (b.resource == "lock / blocking wait") is named


def test_nothing_saturated_says_so_with_the_nearest():
    b = name_bottleneck(step(0, 2), step(1, 4, p95=2.0, busiest_thread_cores=0.4))
    assert b.resource is None
    assert "nearest: CPU of the busiest thread 47%" in b.summary


def test_unmeasured_figures_score_zero_not_saturated():
    b = name_bottleneck(None, step(0, 2, p95=2.0))
    assert b.resource is None and all(c.score == 0 for c in b.candidates)


def test_step_round_trips_through_dict():
    s = step(3, 6, errors={"timeout": 2}, offcpu_by_kind={"lock (futex)": 1.5}, unmeasured={"gc": "no probe"})
    data = s.to_dict()
    assert data["error_rate"] == 0.02
    assert StepFigures.from_dict(data) == s


def test_preemption_is_not_mistaken_for_a_lock():
    # Off-CPU 60 % of the time, but 55 % of it runnable and waiting for a CPU: contention, not a lock.
    contended = step(1, 8, p95=2.0, busiest_thread_cores=0.4, busiest_thread_offcpu_share=0.6, queue_waiting_mean=3.0,
                     runq_wait_per_s=0.55, cpu_cores=0.45)
    b = name_bottleneck(step(0, 4), contended)
    assert b.resource == "CPU contention (run queue)"
    lock = next(c for c in b.candidates if c.resource == "lock / blocking wait")
    assert lock.score == pytest.approx(0.05 / BLOCKED_OFFCPU_SATURATED)


def test_what_rose_across_the_knee_beats_steady_background():
    # The host's run-queue wait was as bad at the last good step; the GC pause share quadrupled.
    good = step(0, 1, cpu_cores=0.08, runq_wait_per_s=0.21, gc_pause_share=0.026, gc_collections_per_s=250)
    bad = step(1, 2, p95=3.4, cpu_cores=0.24, runq_wait_per_s=0.66, gc_pause_share=0.118, gc_collections_per_s=1000)
    b = name_bottleneck(good, bad)
    assert b.resource == "GC"
    assert "also saturated: CPU contention (run queue) (score 2.62 -> 2.75)" in b.summary
    gc = next(c for c in b.candidates if c.resource == "GC")
    assert gc.score_good == pytest.approx(0.52) and gc.rise == pytest.approx(1.84)


@pytest.mark.parametrize("gc_share, named", [(0.15, "GC"), (0.06, "CPU contention (run queue)")])
def test_without_a_good_step_the_candidate_furthest_beyond_its_threshold_is_named(gc_share, named):
    # The lowest step already failed: nothing to have risen from. Run-queue wait 2.0 per CPU second
    # (score 2.0) against a GC pause share of 15 % (score 3.0) or 6 % (score 1.2).
    low = step(0, 2, p95=3.0, cpu_cores=0.3, runq_wait_per_s=0.6, gc_pause_share=gc_share, gc_collections_per_s=500)
    b = name_bottleneck(None, low)
    assert b.resource == named
    assert "no step met the SLO, so none to compare with: named the resource furthest beyond its threshold" in b.summary
    other = "CPU contention (run queue)" if named == "GC" else "GC"
    other_score = next(c.score for c in b.candidates if c.resource == other)
    assert f"also saturated: {other} (score {other_score:.2f})" in b.summary  # no "0.00 ->": there was no before
    assert all(c.score_good is None and c.rise is None for c in b.candidates)


@pytest.mark.parametrize("per_s, named", [(GC_FREQUENT_PER_S, "GC"), (0.3, "CPU contention (run queue)")])
def test_rare_long_gc_pauses_on_a_contended_host_are_contention(per_s, named):
    # 9.6 % of wall in GC from 0.3 collections/s while threads wait 2.9 s per CPU second: preempted pauses.
    good = step(0, 2, cpu_cores=0.1, runq_wait_per_s=0.2, gc_pause_share=0.0, gc_collections_per_s=0.1)
    bad = step(1, 4, p95=2.1, cpu_cores=0.25, runq_wait_per_s=0.73, gc_pause_share=0.096, gc_collections_per_s=per_s)
    assert name_bottleneck(good, bad).resource == named
