"""Seeded synthetic Windows: Poisson arrivals, log-normal latencies in real bucket bounds, and every source's signal."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from analysis.window import (
    DeliveryReading,
    GcReading,
    LatencyReading,
    OffCpuReading,
    ProcessReading,
    RunQueueReading,
    StackReading,
    SyscallReading,
    TcpReading,
    Window,
)

BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, math.inf)

FUTEX = "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_futex;do_futex;futex_wait;__futex_wait;schedule"
POLL = "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pselect6;core_sys_select;do_select;schedule"
SLEEP = "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_clock_nanosleep;hrtimer_nanosleep;do_nanosleep;schedule"
FSYNC = "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_fsync;ext4_sync_file;jbd2_log_wait_commit;schedule"
STOP = "exit_to_user_mode_loop;arch_do_signal_or_restart;get_signal;do_signal_stop;schedule"
PREEMPT = "asm_sysvec_apic_timer_interrupt;irqentry_exit_to_user_mode;schedule;__schedule"

IDLE_LOOP = "Thread.run (threading.py:971);handler_thread (waitress/task.py:64);Condition.wait (threading.py:295)"
APP = "main (app/serve.py:10);Scheduler.loop (app/scheduler.py:50)"


@dataclass(frozen=True)
class Load:
    """What a synthetic window carries; each fault field adds its signal on top of a healthy server."""

    rate: float = 4.0
    tokens: float = 32.0
    base_latency: float = 0.12     # mean latency at rate 4 and 32 tokens
    elasticity: float = 0.3        # latency ~ rate ** elasticity: mild batching cost of more load
    slowdown: float = 1.0          # the regression itself: latency multiplier
    gc_pause: float = 0.0008       # s/s
    lock_wait_threads: float = 0.0
    futex_extra: float = 0.0       # s/s
    sleep: float = 0.0             # s/s
    fsync: float = 0.0             # s/s
    stopped: float = 0.0           # s/s
    syscalls_per_request: float = 400.0
    retransmits: float = 0.0       # per window
    runq_per_cpu: float = 0.3
    cpu_per_token: float = 0.002
    stuck_threads: int = 0         # stopped or in disk sleep at the window's end
    hot_function: str | None = None
    delivery: bool = False         # the window carries the delivery probe's reading
    reply_loss: float = 0.0        # share of replies that wait for an RTO (0.2-0.45 s) to reach the client
    synack_loss: float = 0.0       # share of connections (one per request) whose SYN-ACK is resent: 1-1.1 s wait
    host_noise: float = 0.0        # a shared host: each window's latency x exp(N(0, host_noise)), other tenants' work
    request_loss: float = 0.0      # share of connections whose first request is resent: arrives 0.2-0.65 s late
    early_connects: float = 0.0    # share of connections opened ahead of use, first request 0.2-3 s after the handshake
    first_requests: bool = False   # the delivery reading times first requests (older recordings do not)


def window(i: int, load: Load = Load(), seed: int = 0, interval: float = 5.0, target: str = "t") -> Window:
    """Window number i (start = 1000 + i * interval) of a server under `load`, deterministic per (seed, i)."""
    rng = random.Random(seed * 100003 + i)
    start = 1000.0 + i * interval
    n = _poisson(rng, load.rate * interval)
    scale = load.base_latency * (load.rate / 4.0) ** load.elasticity * (load.tokens / 32.0) * load.slowdown
    if load.host_noise:
        scale *= math.exp(rng.gauss(0, load.host_noise))
    lat = sorted(scale * math.exp(rng.gauss(-0.06, 0.35)) for _ in range(n))
    buckets = dict.fromkeys(("+Inf" if math.isinf(b) else repr(b) for b in BOUNDS), 0.0)
    for x in lat:
        b = next(b for b in BOUNDS if x <= b)
        buckets["+Inf" if math.isinf(b) else repr(b)] += 1
    tokens = n * load.tokens
    q = (lambda p: lat[min(n - 1, int(p * n))]) if n else (lambda p: None)
    latency = LatencyReading(p50_seconds=q(0.5), p95_seconds=q(0.95), p99_seconds=q(0.99),
                             mean_seconds=sum(lat) / n if n else None, requests=float(n), request_rate=n / interval,
                             buckets=buckets, tokens_per_second=tokens / interval, waiting=0.0, running=1.0)
    cpu = load.cpu_per_token * tokens + 0.05 * interval
    jitter = 1 + rng.gauss(0, 0.05)
    stacks = {FUTEX: int(30e6 * interval * jitter + load.futex_extra * 1e6 * interval), POLL: int(1e6 * interval)}
    for stack, per_s in ((SLEEP, load.sleep), (FSYNC, load.fsync), (STOP, load.stopped), (PREEMPT, 0.05)):
        if per_s:
            stacks[stack] = int(per_s * 1e6 * interval * jitter)
    ticks = int(49 * interval)
    idle = {IDLE_LOOP: ticks * 30, APP + ";Model.forward (app/model.py:9)": int(ticks * 0.1 * jitter)}
    if load.lock_wait_threads:
        idle[APP + ";Scheduler.step (app/scheduler.py:80)"] = int(ticks * load.lock_wait_threads)
    active = {APP + ";Model.forward (app/model.py:9)": int(ticks * 0.5 * jitter), APP + ";sample (app/model.py:30)": 20}
    if load.hot_function:
        active[APP + f";{load.hot_function} (app/hot.py:1)"] = ticks
    delivery = None
    if (load.delivery or load.reply_loss or load.synack_loss or load.first_requests or load.request_loss
            or load.early_connects):
        lost = sum(1 for _ in range(n) if rng.random() < load.reply_loss)
        times = [rng.uniform(0.0002, 0.002) for _ in range(n - lost)] + [rng.uniform(0.2, 0.45) for _ in range(lost)]
        dbuckets = dict.fromkeys(buckets, 0.0)
        for x in times:
            b = next(b for b in BOUNDS if x <= b)
            dbuckets["+Inf" if math.isinf(b) else repr(b)] += 1
        delivery = DeliveryReading(replies=n, retransmitted=lost, rto_replies=lost, buckets=dbuckets,
                                   delivery_seconds=sum(times), srtt_mean_seconds=0.0005, retransmits=lost,
                                   rto_stall_seconds=0.2 * lost)
        waits = [rng.uniform(1.0, 1.1) for _ in range(n) if rng.random() < load.synack_loss]
        delivery.synack_retransmits, delivery.connects = len(waits), n
        delivery.slow_connects, delivery.connect_wait_seconds = len(waits), sum(waits)
        if load.first_requests or load.request_loss or load.early_connects:
            late = [rng.uniform(0.2, 0.65) for _ in range(n) if rng.random() < load.request_loss]
            late += [rng.uniform(0.2, 3.0) for _ in range(n) if rng.random() < load.early_connects]
            delivery.first_requests, delivery.late_requests = n, len(late)
            delivery.request_wait_seconds = sum(late)
            # The same path loses the clients' ACKs as often: the server resends for those (an RTO each).
            acks = sum(1 for _ in range(n) if rng.random() < load.request_loss)
            delivery.retransmits += acks
            delivery.rto_stall_seconds += 0.2 * acks
    return Window(
        target=target, pid=4242, start=start, end=start + interval, delivery=delivery,
        syscalls=SyscallReading(counts={"futex": int(n * load.syscalls_per_request * 0.8),
                                        "sendto": int(n * load.syscalls_per_request * 0.2)}),
        offcpu=OffCpuReading(seconds=sum(stacks.values()) / 1e6, stacks=stacks),
        gc=GcReading(collections=5, pause_seconds=load.gc_pause * interval * jitter,
                     max_pause_seconds=load.gc_pause * interval / 3),
        tcp=TcpReading(retransmits=int(load.retransmits) + (delivery.retransmits if delivery else 0)),
        runqueue=RunQueueReading(total_seconds=load.runq_per_cpu * cpu * jitter),
        process=ProcessReading(cpu_seconds=cpu, rss_bytes=300 << 20, threads=35, voluntary_ctx_switches=100,
                               involuntary_ctx_switches=10, stopped_threads=load.stuck_threads, disk_wait_threads=0),
        stacks=StackReading(active=active, idle=idle, rate_hz=49.0, samples=ticks),
        latency=latency)


def windows(start: int, count: int, load: Load = Load(), seed: int = 0) -> list[Window]:
    return [window(i, load, seed) for i in range(start, start + count)]


def strip(w: Window, *sections: str) -> Window:
    """The window with sections set to None and a reason for each in errors, as a failed source leaves it."""
    return replace(w, **dict.fromkeys(sections), errors={**w.errors, **{s: f"{s} probe failed (test)" for s in sections}})


def unanswered(w: Window, connect: bool = False) -> Window:
    """The window as the agent leaves it when the server's latency endpoint did not answer: no latency reading, and
    the source named in `unanswered` (and in `unreachable` when not even the connection was made)."""
    said = "unreachable: timed out" if connect else "did not answer: timed out"
    return replace(w, latency=None, unanswered=["latency"], unreachable=["latency"] if connect else [],
                   errors={**w.errors, "latency": f"latency endpoint http://127.0.0.1:1/metrics {said}"})


def _poisson(rng: random.Random, lam: float) -> int:
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1
