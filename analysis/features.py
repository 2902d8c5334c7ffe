"""Per-window features: the numbers the detector and attribution read, None where a source did not measure."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from analysis.client_latency import bucket_quantiles, client_buckets, connect_wait, late_requests
from analysis.culprits import own_seconds
from analysis.own_syscalls import workload_counts
from analysis.waits import by_kind
from analysis.window import DeliveryReading, Window

# Leaf frames of py-spy idle stacks where a thread waits for work rather than inside the work: the
# standard library's waiting primitives and event loops. Idle samples anywhere else are a thread
# blocked in the middle of its own code (a lock, a sleep, a disk write): the lock signal.
IDLE_LOOP_FILES = ("threading.py", "queue.py", "selectors.py", "socket.py", "socketserver.py", "selector_events.py",
                   "base_events.py", "asyncio/", "wasyncore.py", "multiprocessing/connection.py", "concurrent/futures/")


@dataclass(frozen=True)
class Features:
    """One window's features; every field None when its source was off, failed or saw no requests."""

    duration: float
    requests: float | None = None
    # The latency endpoint did not answer this window (Window.unanswered): its requests are unknown, not zero.
    latency_unanswered: bool = False
    # 1 when the agent could not connect to the latency endpoint at all (Window.unreachable), 0 when it did; None
    # where that is not known (no latency source, or one that failed some other way).
    latency_unreachable: float | None = None
    request_rate: float | None = None
    tokens_per_second: float | None = None
    tokens_per_request: float | None = None
    mean_seconds: float | None = None
    p50_seconds: float | None = None
    p95_seconds: float | None = None
    p99_seconds: float | None = None
    waiting: float | None = None
    running: float | None = None
    ttft_seconds: float | None = None
    tpot_seconds: float | None = None
    # Latency histogram delta of this window: (upper bound, requests), ascending, +Inf last.
    buckets: tuple[tuple[float, float], ...] = ()
    syscalls_per_second: float | None = None
    syscalls_per_request: float | None = None
    top_syscalls: dict[str, float] = field(default_factory=dict)
    # Off-CPU seconds per second by wait kind (analysis.waits.WAIT_KINDS).
    offcpu: dict[str, float] | None = None
    gc_pause_per_second: float | None = None
    gc_max_pause_seconds: float | None = None
    retransmits_per_second: float | None = None
    runqueue_per_second: float | None = None
    cpu_per_second: float | None = None
    cpu_per_token: float | None = None
    rss_bytes: float | None = None
    voluntary_switches_per_second: float | None = None
    involuntary_switches_per_second: float | None = None
    # Threads waiting off-CPU inside their own code, on average over the window: py-spy idle samples whose
    # leaf is not an idle loop (IDLE_LOOP_FILES), per sampling tick.
    app_wait_threads: float | None = None
    # Threads stopped (a signal, a tracer) or in uninterruptible disk sleep at the window's end: a wait still in
    # progress, read from /proc, so it is there where the off-CPU probe cannot run.
    stuck_threads: float | None = None
    # Replies' delivery to the clients (Window.delivery, probes/delivery.py): mean and p99 seconds from the last
    # write to the client's ACK, share of replies retransmitted, RTO stall seconds per second. None without it.
    delivery_mean_seconds: float | None = None
    delivery_p99_seconds: float | None = None
    retransmitted_share: float | None = None
    rto_stall_per_second: float | None = None
    # The clients' latency histogram (server latency + delivery, analysis/client_latency.py) on `buckets`' bounds;
    # () where either is missing.
    client_buckets: tuple[tuple[float, float], ...] = ()
    # Pressure stall information per second of window (agent/sources/pressure.py): "cpu_some", "cpu_full",
    # "memory_some", ... "io_full" -> stalled seconds per second, of the target's cgroup and of the host.
    pressure: dict[str, float] | None = None
    host_pressure: dict[str, float] | None = None
    major_faults_per_second: float | None = None
    # Seconds per request the clients waited for SYN-ACK retransmits while connecting (DeliveryReading's
    # connect_wait_seconds over the window's requests); None without delivery or requests.
    connect_wait_per_request: float | None = None
    # Handshakes completed on the target's ports, and those of them that waited for a resent SYN-ACK (DeliveryReading's
    # connects and slow_connects): counts, for the test of stall events against the baseline's rate
    # (analysis/stall_events.py); None without delivery.
    connects: float | None = None
    slow_connects: float | None = None
    # Seconds per request that fresh connections' first requests arrived late after the handshake, 0.2-3.5 s: a lost
    # request the client resent (DeliveryReading's request_wait_seconds over the window's requests), in a window in
    # which the server's sockets resent something too (client_latency.late_requests); None where not measured.
    request_wait_per_request: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _buckets(raw: dict[str, float]) -> tuple[tuple[float, float], ...]:
    pairs = []
    for bound, count in raw.items():
        try:
            pairs.append((float(bound), float(count)))
        except ValueError:
            continue  # a malformed bound cannot be placed; the others still describe the window
    return tuple(sorted(pairs))


def _delivery(d: DeliveryReading, dur: float) -> dict[str, float]:
    out = {"rto_stall_per_second": d.rto_stall_seconds / dur}
    if d.replies > 0:
        p99 = bucket_quantiles(d.buckets, np.array([0.99]))
        out.update(delivery_mean_seconds=d.delivery_seconds / d.replies, retransmitted_share=d.retransmitted / d.replies)
        if p99 is not None:
            out["delivery_p99_seconds"] = float(p99[0])
    return out


def _pressure(psi: dict[str, dict[str, float]] | None, dur: float) -> dict[str, float] | None:
    if psi is None:
        return None
    return {f"{resource}_{kind}": seconds / dur for resource, kinds in psi.items() for kind, seconds in kinds.items()}


def is_idle_loop(leaf: str) -> bool:
    """Whether a py-spy leaf frame ('func (file.py:line)') is a library wait for work."""
    return any(name in leaf for name in IDLE_LOOP_FILES)


def extract(window: Window) -> Features:
    """The features of one window; a section that is None gives None features, never zeros."""
    dur = window.duration
    if not dur > 0:
        raise ValueError(f"window has no duration: start {window.start!r}, end {window.end!r}")
    f: dict = {"duration": dur, "latency_unanswered": "latency" in window.unanswered}
    la = window.latency
    if la is not None or "latency" in window.unanswered:  # a scrape reached the port, or was seen not to
        f["latency_unreachable"] = 1.0 if "latency" in window.unreachable else 0.0
    requests = None
    if la is not None:
        requests = la.requests
        f["requests"] = la.requests
        f["request_rate"] = la.request_rate
        f["tokens_per_second"] = la.tokens_per_second
        if la.tokens_per_second is not None and la.requests > 0:
            f["tokens_per_request"] = la.tokens_per_second * dur / la.requests
        if la.requests > 0:
            f.update(mean_seconds=la.mean_seconds, p50_seconds=la.p50_seconds, p95_seconds=la.p95_seconds,
                     p99_seconds=la.p99_seconds, buckets=_buckets(la.buckets))
        f.update(waiting=la.waiting, running=la.running, ttft_seconds=la.ttft_mean_seconds,
                 tpot_seconds=la.tpot_mean_seconds)
    if window.syscalls is not None:
        counts = workload_counts(window.syscalls.counts)  # the agent's own trampolines are not the server's work
        total = float(sum(counts.values()))
        f["syscalls_per_second"] = total / dur
        if requests:
            f["syscalls_per_request"] = total / requests
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:5]
        f["top_syscalls"] = {name: count / dur for name, count in top}
    if window.offcpu is not None:
        f["offcpu"] = {kind: us / 1e6 / dur for kind, us in by_kind(window.offcpu.stacks).items()}
    if window.gc is not None:
        f["gc_pause_per_second"] = window.gc.pause_seconds / dur
        f["gc_max_pause_seconds"] = window.gc.max_pause_seconds
    if window.tcp is not None:
        f["retransmits_per_second"] = window.tcp.retransmits / dur
    if window.delivery is not None:
        f.update(_delivery(window.delivery, dur))
        f.update(connects=float(window.delivery.connects), slow_connects=float(window.delivery.slow_connects))
        if la is not None and la.requests > 0 and la.buckets and window.delivery.replies > 0:
            slow = connect_wait(window.delivery, la.requests, late=False)
            f["client_buckets"] = _buckets(client_buckets(la.buckets, window.delivery.buckets, slow))
        if la is not None and la.requests > 0:
            f["connect_wait_per_request"] = window.delivery.connect_wait_seconds / la.requests
            if window.delivery.first_requests is not None:  # measured (older recordings do not carry it)
                f["request_wait_per_request"] = late_requests(window.delivery)[1] / la.requests
    if window.runqueue is not None:
        # Less what the agent's own CPU (py-spy, the daemon) kept the target waiting: the agent is never a cause.
        f["runqueue_per_second"] = (window.runqueue.total_seconds - own_seconds(window.runqueue)) / dur
    if window.process is not None:
        p = window.process
        f.update(cpu_per_second=p.cpu_seconds / dur, rss_bytes=float(p.rss_bytes),
                 voluntary_switches_per_second=p.voluntary_ctx_switches / dur,
                 involuntary_switches_per_second=p.involuntary_ctx_switches / dur)
        if p.stopped_threads is not None and p.disk_wait_threads is not None:
            f["stuck_threads"] = float(p.stopped_threads + p.disk_wait_threads)
        tokens = la.tokens_per_second * dur if la is not None and la.tokens_per_second is not None else None
        if tokens is not None and tokens > 0:
            f["cpu_per_token"] = p.cpu_seconds / tokens
    if window.stacks is not None:
        ticks = window.stacks.samples or window.stacks.rate_hz * dur
        if ticks > 0:
            waits = sum(n for stack, n in window.stacks.idle.items() if not is_idle_loop(stack.rsplit(";", 1)[-1]))
            f["app_wait_threads"] = waits / ticks
    if window.pressure is not None:
        pr = window.pressure
        f["pressure"] = _pressure(pr.cgroup, dur)
        f["host_pressure"] = _pressure(pr.host, dur)
        if pr.major_faults is not None:
            f["major_faults_per_second"] = pr.major_faults / dur
    # A family's threads waiting in their own code: each member's own average, summed (analysis.family._app_wait).
    if (waiting := [m.app_wait_threads for m in window.members if m.app_wait_threads is not None]):
        f["app_wait_threads"] = sum(waiting)
    return Features(**f)
