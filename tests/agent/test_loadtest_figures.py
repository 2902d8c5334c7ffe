"""A step's figures from client outcomes and a target Window; the early-stop rule at its edges."""

import pytest

from agent.loadtest.client import Outcome, StepLoad
from agent.loadtest.figures import MIN_REQUESTS_TO_STOP, add_window, clearly_broken, client_figures, wait_kind
from analysis.capacity import Slo
from analysis.window import (
    GcReading,
    Log2Histogram,
    OffCpuReading,
    ProcessReading,
    RunQueueReading,
    SyscallReading,
    TcpReading,
    Window,
)

SLO = Slo(1.0, 0.01)


def ok(at: float, latency: float, tokens: int = 10) -> Outcome:
    return Outcome(at, "ok", latency, latency / 4, tokens)


def test_client_figures_count_errors_by_kind_and_rates_over_sending_time():
    load = StepLoad(rate=4, planned_s=10, sent_s=10.0, dropped=1,
                    outcomes=[ok(i * 0.5, 0.1 * (i + 1)) for i in range(10)]
                    + [Outcome(6, "429", 0.01), Outcome(7, "timeout", 30.0), Outcome(8, "5xx", 0.2)])
    s = client_figures(3, load)
    assert (s.index, s.sent, s.ok) == (3, 14, 10)
    assert s.errors == {"429": 1, "timeout": 1, "5xx": 1, "dropped": 1}
    assert s.achieved_rps == pytest.approx(1.0) and s.tokens_per_s == pytest.approx(10.0)
    assert s.client_p50_s == pytest.approx(0.5) and s.client_p95_s == pytest.approx(1.0)
    assert s.ttft_p50_s == pytest.approx(0.125)
    assert s.error_rate == pytest.approx(4 / 14)


def test_client_figures_of_a_step_with_no_success_are_none_not_zero():
    s = client_figures(0, StepLoad(rate=1, planned_s=5, sent_s=5, outcomes=[Outcome(0, "connection", 0.0)]))
    assert s.client_p95_s is None and s.ttft_p95_s is None and s.ok == 0


def test_clearly_broken_needs_enough_requests_and_time():
    slow = [ok(i * 0.1, 3.0) for i in range(MIN_REQUESTS_TO_STOP - 1)]
    assert clearly_broken(SLO, slow, [], 10.0) is None
    assert clearly_broken(SLO, slow + [ok(2, 3.0)], [], 4.9) is None
    assert "20 of 20 requests over the SLO's 1000 ms" in clearly_broken(SLO, slow + [ok(2, 3.0)], [], 5.0)


def test_clearly_broken_counts_requests_in_flight_past_the_slo():
    fast = [ok(i * 0.1, 0.2) for i in range(16)]
    assert clearly_broken(SLO, fast, [5.5, 5.6, 5.7, 5.8], 6.0) is None  # in flight, but younger than the SLO
    assert clearly_broken(SLO, fast, [1.0, 1.1, 1.2, 1.3], 6.0) is not None  # 4 of 20 over: 20 % > 15 %


def test_clearly_broken_on_errors():
    mixed = [ok(i, 0.1) for i in range(15)] + [Outcome(i, "5xx", 0.1) for i in range(5)]
    assert "5 of 20 requests failed" in clearly_broken(SLO, mixed, [], 6.0)
    assert clearly_broken(SLO, mixed[:-1] + [ok(1, 0.1)], [], 6.0) is None  # 4 errors are not yet clear


@pytest.mark.parametrize("stack, kind", [
    ("entry_SYSCALL_64;do_syscall_64;__x64_sys_futex;do_futex;futex_wait;schedule", "lock (futex)"),
    ("do_syscall_64;__x64_sys_epoll_wait;do_epoll_wait;ep_poll;schedule_hrtimeout_range", "poll (idle)"),
    ("do_syscall_64;__sys_recvfrom;inet_recvmsg;tcp_recvmsg;sk_wait_data", "network"),
    ("do_syscall_64;__x64_sys_clock_nanosleep;hrtimer_nanosleep;do_nanosleep", "sleep"),
    ("asm_sysvec_apic_timer_interrupt;irqentry_exit;schedule", "preempted"),
    ("[blocked since before tracing]", "other"),
])
def test_wait_kinds(stack, kind):
    assert wait_kind(stack) == kind


def test_window_figures_are_per_second_and_per_request():
    step = client_figures(0, StepLoad(rate=2, planned_s=10, sent_s=10, outcomes=[ok(i, 0.2) for i in range(20)]))
    w = Window(target="t", pid=42, start=100.0, end=110.0,
               process=ProcessReading(cpu_seconds=5.0, voluntary_ctx_switches=300, involuntary_ctx_switches=100),
               offcpu=OffCpuReading(seconds=40.0, by_thread={43: 2.0},
                                    stacks={"x;futex_wait": 30_000_000, "y;ep_poll": 10_000_000}),
               gc=GcReading(collections=50, pause_seconds=0.5),
               runqueue=RunQueueReading(histogram=Log2Histogram("us", [0, 5, 3, 1]), total_seconds=2.0),
               syscalls=SyscallReading(counts={"read": 1000, "write": 1000}), tcp=TcpReading(retransmits=3))
    add_window(step, w, (43, 0.45), 2, {})
    assert step.cpu_cores == pytest.approx(0.5) and step.busiest_thread_cores == 0.45
    assert step.busiest_thread_offcpu_share == pytest.approx(0.2)
    assert step.offcpu_by_kind == {"lock (futex)": pytest.approx(3.0), "poll (idle)": pytest.approx(1.0)}
    assert step.gc_pause_share == pytest.approx(0.05) and step.gc_collections_per_s == pytest.approx(5.0)
    assert step.runq_wait_per_s == pytest.approx(0.2) and step.runq_p99_us == 16.0
    assert step.syscalls_per_request == pytest.approx(100.0) and step.retransmits == 3
    assert step.ctx_switches_per_s == pytest.approx(40.0) and step.involuntary_ctx_switches_per_s == 10.0
    assert step.unmeasured == {}


def _pool_window(seconds: float = 10.0) -> Window:
    """A server with 30 pool threads asleep on a futex all step and two threads that worked."""
    futex = "entry_SYSCALL_64;do_syscall_64;__x64_sys_futex;do_futex;futex_wait"
    by_thread = {100 + i: seconds for i in range(30)} | {1: 6.0, 2: 3.0}
    return Window(target="t", pid=1, start=0.0, end=seconds,
                  offcpu=OffCpuReading(seconds=sum(by_thread.values()), by_thread=by_thread,
                                       stacks={f"{futex};schedule": int((30 * seconds + 2.0) * 1e6),
                                               "do_syscall_64;do_epoll_wait;ep_poll;schedule": 7_000_000}))


def test_threads_that_slept_through_the_step_are_not_read_as_a_lock():
    # Without the split, 30 idle pool threads read as 30 s/s of "lock (futex)" at every load.
    idle = {100 + i: "entry_SYSCALL_64;do_syscall_64;__x64_sys_futex;do_futex;futex_wait" for i in range(30)}
    step = client_figures(0, StepLoad(rate=2, planned_s=10, sent_s=10, outcomes=[ok(1, 0.2)]))
    add_window(step, _pool_window(), None, 2, idle)
    assert step.offcpu_by_kind == {"poll (idle)": pytest.approx(0.7), "lock (futex)": pytest.approx(0.2)}
    assert step.idle_threads == 30 and step.idle_offcpu_by_kind == {"lock (futex)": pytest.approx(30.0)}
    assert "idle_threads" not in step.unmeasured
    everything = client_figures(0, StepLoad(rate=2, planned_s=10, sent_s=10, outcomes=[ok(1, 0.2)]))
    add_window(everything, _pool_window(), None, 2, {})
    assert everything.offcpu_by_kind["lock (futex)"] == pytest.approx(30.2) and everything.idle_threads == 0


def test_idle_threads_whose_stacks_cannot_be_read_stay_in_the_kinds_and_say_so():
    step = client_figures(0, StepLoad(rate=2, planned_s=10, sent_s=10, outcomes=[ok(1, 0.2)]))
    add_window(step, _pool_window(), None, 2, {100 + i: None for i in range(30)})
    assert step.offcpu_by_kind["lock (futex)"] == pytest.approx(30.2) and step.idle_threads == 0
    assert "30 threads slept through the step" in step.unmeasured["idle_threads"]
    unread = client_figures(0, StepLoad(rate=2, planned_s=10, sent_s=10, outcomes=[ok(1, 0.2)]))
    add_window(unread, _pool_window(), None, 2, None)
    assert unread.idle_threads is None and "could not be read" in unread.unmeasured["idle_threads"]


def test_missing_readings_are_none_with_the_window_reason():
    step = client_figures(0, StepLoad(rate=2, planned_s=10, sent_s=10, outcomes=[ok(1, 0.2)]))
    add_window(step, Window(target="t", pid=42, start=0.0, end=10.0, errors={"gc": "unsupported: no libpython"}),
               None, 2)
    assert step.gc_pause_share is None and step.unmeasured["gc"] == "unsupported: no libpython"
    assert step.busiest_thread_cores is None and "busiest_thread_cores" in step.unmeasured
    assert step.retransmits is None and step.unmeasured["tcp"] == "probe not enabled"


def test_backlog_drained_after_the_step_is_not_throughput():
    load = StepLoad(rate=4, planned_s=10, sent_s=10.0, outcomes=[ok(1, 0.5), ok(2, 0.5), ok(9, 3.0)])
    s = client_figures(0, load)
    assert s.ok == 3 and s.achieved_rps == pytest.approx(0.2) and s.tokens_per_s == pytest.approx(2.0)
    assert s.client_p95_s == 3.0  # its latency still counts
