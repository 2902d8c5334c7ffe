"""One step's figures from the client's outcomes, the server's scrape and the target's window."""

from __future__ import annotations

import math
from collections import Counter

from agent.loadtest.client import Outcome, StepLoad
from agent.loadtest.server_metrics import ServerStep
from analysis.capacity import Slo, StepFigures
from analysis.window import Window

# Kernel frames that say what an off-CPU thread waited for; the first kind whose marker is in the stack wins.
WAIT_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lock (futex)", ("futex",)),
    ("network", ("tcp_", "sock_", "inet_", "unix_stream", "sk_wait")),
    ("poll (idle)", ("ep_poll", "do_sys_poll", "do_select", "core_sys_select")),
    ("sleep", ("nanosleep", "hrtimer_")),
    ("pipe", ("pipe_",)),
    ("disk I/O", ("io_schedule", "blk_", "ext4_", "filemap_")),
    ("page fault", ("page_fault", "handle_mm_fault")),
    ("preempted", ("irqentry_exit", "exit_to_user_mode", "preempt_schedule")),
)
MIN_REQUESTS_TO_STOP = 20  # fewer finished + pending requests say too little about a p95
MIN_SECONDS_TO_STOP = 5.0  # the first seconds of a step carry the previous step's tail


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def wait_kind(stack: str) -> str:
    for kind, markers in WAIT_KINDS:
        if any(m in stack for m in markers):
            return kind
    return "other"


def clearly_broken(slo: Slo, finished: list[Outcome], pending: list[float], elapsed: float) -> str | None:
    """A reason to stop the step now: far more than 5 % of requests are already over the SLO, or failing.

    A request still in flight whose age passed the SLO will finish over it, so it counts as over.
    """
    total = len(finished) + len(pending)
    if total < MIN_REQUESTS_TO_STOP or elapsed < MIN_SECONDS_TO_STOP:
        return None
    errors = sum(1 for o in finished if o.kind != "ok")
    if errors >= 5 and errors / total > max(3 * slo.max_error_rate, 0.05):
        return f"{errors} of {total} requests failed by {elapsed:.0f}s"
    over = sum(1 for o in finished if o.kind == "ok" and o.latency_s > slo.p95_s)
    over += sum(1 for at in pending if elapsed - at > slo.p95_s)
    if over / total > 0.15:  # three times the 5 % a p95 allows
        return f"{over} of {total} requests over the SLO's {slo.p95_s * 1000:.0f} ms by {elapsed:.0f}s"
    return None


def client_figures(index: int, load: StepLoad) -> StepFigures:
    """The client's half: rates, errors by kind, latency and TTFT percentiles (over arrivals in the step)."""
    ok = [o for o in load.outcomes if o.kind == "ok"]
    errors = Counter(o.kind for o in load.outcomes if o.kind != "ok")
    if load.dropped:
        errors["dropped"] = load.dropped
    seconds = max(load.sent_s, 1e-9)
    # Throughput is what finished while the step sent: an overloaded server's backlog, drained after
    # the step, must not read as capacity.
    done = [o for o in ok if o.at + o.latency_s <= load.sent_s]
    latencies = [o.latency_s for o in ok]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    return StepFigures(
        index=index, offered_rps=load.rate, planned_s=load.planned_s, duration_s=load.sent_s,
        sent=len(load.outcomes) + load.dropped, ok=len(ok), achieved_rps=len(done) / seconds,
        tokens_per_s=sum(o.tokens for o in done) / seconds, errors=dict(errors),
        stopped_early=load.stopped_early is not None,
        client_p50_s=percentile(latencies, 50), client_p95_s=percentile(latencies, 95),
        client_p99_s=percentile(latencies, 99), ttft_p50_s=percentile(ttfts, 50), ttft_p95_s=percentile(ttfts, 95),
    )


def _idle_kinds(step: StepFigures, by_thread: dict[int, float], idle: dict[int, str | None] | None) -> Counter[str]:
    """Off-CPU seconds of the threads that slept through the step, by the wait their stack shows."""
    out: Counter[str] = Counter()
    if idle is None:
        step.unmeasured["idle_threads"] = "the target's threads could not be read"
        return out
    unread = [tid for tid, stack in idle.items() if stack is None]
    step.idle_threads = len(idle) - len(unread)
    if unread:
        step.unmeasured["idle_threads"] = (f"{len(unread)} threads slept through the step but their kernel stacks "
                                           "could not be read (needs root): their waits stay in offcpu_by_kind")
    for tid, stack in idle.items():
        if stack is not None:
            out[wait_kind(stack)] += by_thread.get(tid, 0.0)
    return out


def add_server(step: StepFigures, server: ServerStep) -> None:
    step.server_p50_s, step.server_p95_s, step.server_p99_s = server.p50_s, server.p95_s, server.p99_s
    step.queue_waiting_mean, step.queue_waiting_max = server.waiting_mean, server.waiting_max
    step.running_mean, step.batch_mean = server.running_mean, server.batch_mean
    for name, why in server.errors.items():
        step.unmeasured[f"server {name}"] = why


def add_window(step: StepFigures, window: Window | None, busiest: tuple[int, float] | None,
               host_cpus: int | None, idle: dict[int, str | None] | None = None) -> None:
    """The target's half: CPU, off-CPU by wait kind, GC, run queue, syscalls, retransmits.

    `idle`: threads that slept through the step -> their kernel stack (None: unreadable), from
    idle_threads.idle_since; their off-CPU time moves out of offcpu_by_kind into idle_offcpu_by_kind.
    """
    step.host_cpus = host_cpus
    if busiest is not None:
        step.busiest_thread_cores = busiest[1]
    else:
        step.unmeasured["busiest_thread_cores"] = "the target's threads could not be read"
    if window is None:
        step.unmeasured["window"] = "no window from the target (it exited?)"
        return
    seconds = max(window.duration, 1e-9)
    why = window.errors
    if (p := window.process) is not None:
        step.cpu_cores = p.cpu_seconds / seconds
        step.ctx_switches_per_s = (p.voluntary_ctx_switches + p.involuntary_ctx_switches) / seconds
        step.involuntary_ctx_switches_per_s = p.involuntary_ctx_switches / seconds
    else:
        step.unmeasured["cpu_cores"] = why.get("process", "no process reading")
    if (o := window.offcpu) is not None:
        kinds: Counter[str] = Counter()
        for stack, micros in o.stacks.items():
            kinds[wait_kind(stack)] += micros / 1e6
        idle_kinds = _idle_kinds(step, o.by_thread, idle)
        # The probe keeps only its top stacks per window, so a kind can hold less than its idle threads' part.
        step.offcpu_by_kind = {k: v / seconds for k, v in (kinds - idle_kinds).most_common()}
        step.idle_offcpu_by_kind = {k: v / seconds for k, v in idle_kinds.most_common()}
        if busiest is not None:
            step.busiest_thread_offcpu_share = o.by_thread.get(busiest[0], 0.0) / seconds
    else:
        step.unmeasured["offcpu"] = why.get("offcpu", "probe not enabled")
    if (g := window.gc) is not None:
        step.gc_pause_share = g.pause_seconds / seconds
        step.gc_collections_per_s = g.collections / seconds
    else:
        step.unmeasured["gc"] = why.get("gc", "probe not enabled")
    if (r := window.runqueue) is not None:
        step.runq_p99_us = r.histogram.quantile(0.99) if r.histogram.total() else None
        step.runq_wait_per_s = r.total_seconds / seconds
    else:
        step.unmeasured["runqueue"] = why.get("runqueue", "probe not enabled")
    if (s := window.syscalls) is not None:
        if step.ok:
            step.syscalls_per_request = sum(s.counts.values()) / step.ok
        else:
            step.unmeasured["syscalls_per_request"] = "no request completed"
    else:
        step.unmeasured["syscalls"] = why.get("syscalls", "probe not enabled")
    if (t := window.tcp) is not None:
        step.retransmits = t.retransmits
    else:
        step.unmeasured["tcp"] = why.get("tcp", "probe not enabled")
