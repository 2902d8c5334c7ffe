"""Prometheus exposition: Collector classes that read the agent's latest state at scrape time."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterator

import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.state import AgentState
from analysis.client_latency import estimate as estimate_client_latency
from analysis.snapshot import TargetTotals
from analysis.window import Log2Histogram

# Fixed bucket bounds so every scrape exposes the same `le` set: 2 us .. ~33 s in powers of two.
_LOG2_SLOTS = 25
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def log2_buckets(hist: Log2Histogram) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs in seconds for a log2 histogram, ending with +Inf."""
    scale = _UNIT_SECONDS[hist.unit]
    out, running = [], 0
    for slot in range(_LOG2_SLOTS):
        running += hist.counts[slot] if slot < len(hist.counts) else 0
        out.append((repr(float(2 ** (slot + 1)) * scale), running))
    out.append(("+Inf", hist.total()))
    return out


class TargetCollector(Collector):
    """Per-target probe and source series."""

    def __init__(self, state: AgentState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        snap = self._state.snapshot()
        totals, latest = snap.totals, snap.latest

        syscalls = CounterMetricFamily("infersight_syscalls", "System calls made by the target, by name.",
                                       labels=["target", "syscall"])
        offcpu = CounterMetricFamily("infersight_offcpu_seconds", "Seconds the target's threads spent off-CPU.",
                                     labels=["target"])
        gc_count = CounterMetricFamily("infersight_gc_collections", "Python GC collections in the target.",
                                       labels=["target"])
        gc_pause = HistogramMetricFamily("infersight_gc_pause_seconds", "Python GC pause durations.",
                                         labels=["target"])
        runq = HistogramMetricFamily("infersight_runqueue_latency_seconds",
                                     "Time the target's threads waited runnable for a CPU.", labels=["target"])
        retrans = CounterMetricFamily("infersight_tcp_retransmits", "TCP segments retransmitted on the target's sockets.",
                                      labels=["target"])
        cpu = CounterMetricFamily("infersight_process_cpu_seconds", "CPU seconds used by the target.",
                                  labels=["target"])
        requests = CounterMetricFamily("infersight_requests", "Requests completed by the target, from its histogram.",
                                       labels=["target"])
        rss = GaugeMetricFamily("infersight_process_resident_memory_bytes", "Target resident memory.",
                                labels=["target"])
        threads = GaugeMetricFamily("infersight_process_threads", "Target thread count.", labels=["target"])
        # `percentile` ("p99"), not `quantile`: that label belongs to summaries (promtool check metrics), and
        # these are the same names the detector's infersight_latency_expected_seconds uses for its band.
        latency = GaugeMetricFamily("infersight_request_latency_seconds",
                                    "Target request latency percentile over the latest window.",
                                    labels=["target", "percentile"])
        # The clients' wait, estimated: server latency + reply delivery (analysis/client_latency.py); only while
        # both were measured in the latest window.
        client = GaugeMetricFamily("infersight_client_latency_seconds",
                                   "Estimated client-side request latency percentile over the latest window "
                                   "(server latency + reply delivery to the client's ACK).",
                                   labels=["target", "percentile"])
        rate = GaugeMetricFamily("infersight_request_rate_per_second", "Target requests per second, latest window.",
                                 labels=["target"])
        pid = GaugeMetricFamily("infersight_target_pid", "Pid of the watched target process.", labels=["target"])

        for name, t in sorted(totals.items()):
            # A counter appears once its source measured this target; a source that never did (a non-Python
            # target's gc, tcp switched off) exports no series at all: not measured is never 0.
            for syscall, n in sorted(t.syscalls.items()):
                syscalls.add_metric([name, syscall], n)
            if "offcpu" in t.measured:
                offcpu.add_metric([name], t.offcpu_seconds)
            if "gc" in t.measured:
                gc_count.add_metric([name], t.gc_collections)
                gc_pause.add_metric([name], log2_buckets(t.gc_pause_histogram), t.gc_pause_seconds)
            if "runqueue" in t.measured:
                runq.add_metric([name], log2_buckets(t.runqueue_histogram), t.runqueue_seconds)
            if "tcp" in t.measured:
                retrans.add_metric([name], t.tcp_retransmits)
            if "process" in t.measured:
                cpu.add_metric([name], t.cpu_seconds)
            if "latency" in t.measured:
                requests.add_metric([name], t.requests)
            pid.add_metric([name], t.pid)
            w = latest.get(name)
            if w and w.process:
                rss.add_metric([name], w.process.rss_bytes)
                threads.add_metric([name], w.process.threads)
            if w and w.latency:
                for q, v in (("p50", w.latency.p50_seconds), ("p95", w.latency.p95_seconds),
                             ("p99", w.latency.p99_seconds)):
                    if v is not None:
                        latency.add_metric([name, q], v)
                rate.add_metric([name], w.latency.request_rate)
            est = estimate_client_latency(w.latency, w.delivery) if w else None
            if est is not None:
                for q, v in (("p50", est.p50_seconds), ("p95", est.p95_seconds), ("p99", est.p99_seconds)):
                    client.add_metric([name, q], v)
        yield from (syscalls, offcpu, gc_count, gc_pause, runq, retrans, cpu, requests, rss, threads, latency,
                    client, rate, pid)
        yield from _member_metrics(totals)

        up = GaugeMetricFamily("infersight_target_up",
                               "1 while a process of the target is watched and serving; 0 while it is down (its "
                               "process ended, or its latency port is closed) or not found yet: the reason is on "
                               "the status page and in /api/status.", labels=["target"])
        for name, status in sorted(snap.targets.items()):
            up.add_metric([name], 1.0 if status.state == "watching" and name not in snap.down else 0.0)
        yield up

        matched = GaugeMetricFamily("infersight_target_processes_matched",
                                    "Processes a target's process_regex matched at the last discovery.",
                                    labels=["target"])
        skipped = GaugeMetricFamily("infersight_target_processes_skipped",
                                    "Processes a target's process_regex matched but the agent does not watch, "
                                    "by reason (not_allowed_user, max_targets).", labels=["target", "reason"])
        for name, sk in sorted(snap.skipped.items()):
            matched.add_metric([name], sk.matched)
            skipped.add_metric([name, "not_allowed_user"], sk.not_allowed)
            skipped.add_metric([name, "max_targets"], sk.over_limit)
        yield from (matched, skipped)

        host = CounterMetricFamily("infersight_host_tcp_retransmits", "TCP retransmits on the whole host.")
        host.add_metric([], snap.host_tcp_retransmits)
        yield host


def _member_metrics(totals: dict[str, TargetTotals]) -> Iterator[Metric]:
    """A family target's processes by role (`process`, capped per target; no pid labels): what each one costs."""
    labels = ["target", "process"]
    processes = GaugeMetricFamily("infersight_member_processes",
                                  "Processes of a family target with this role (process title or comm), latest window.",
                                  labels=labels)
    cpu = CounterMetricFamily("infersight_member_cpu_seconds", "CPU seconds used by a family's processes of this role.",
                              labels=labels)
    offcpu = CounterMetricFamily("infersight_member_offcpu_seconds",
                                 "Seconds a family's processes of this role spent off-CPU.", labels=labels)
    gc_count = CounterMetricFamily("infersight_member_gc_collections",
                                   "Python GC collections in a family's processes of this role.", labels=labels)
    gc_pause = CounterMetricFamily("infersight_member_gc_pause_seconds",
                                   "Python GC pause seconds in a family's processes of this role.", labels=labels)
    rss = GaugeMetricFamily("infersight_member_resident_memory_bytes",
                            "Resident memory of a family's processes of this role, latest window.", labels=labels)
    for name, t in sorted(totals.items()):
        for role, m in sorted(t.members.items()):
            processes.add_metric([name, role], m.processes)
            # Not measured is never 0: a figure no member of the role measured has no series.
            for family, value in ((cpu, m.cpu_seconds), (offcpu, m.offcpu_seconds), (gc_count, m.gc_collections),
                                  (gc_pause, m.gc_pause_seconds), (rss, m.rss_bytes)):
                if value is not None:
                    family.add_metric([name, role], value)
    yield from (processes, cpu, offcpu, gc_count, gc_pause, rss)


class AgentCollector(Collector):
    """The agent's own health: its cost, its windows, and every source's state and errors."""

    def __init__(self, state: AgentState, process: psutil.Process | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._process = process or psutil.Process()
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        snap = self._state.snapshot()
        times = self._process.cpu_times()
        cpu = CounterMetricFamily("infersight_agent_cpu_seconds", "CPU seconds used by the agent process itself.")
        cpu.add_metric([], times.user + times.system)
        # py-spy runs as short-lived children: their CPU shows here once each is reaped.
        children = CounterMetricFamily("infersight_agent_children_cpu_seconds",
                                       "CPU seconds used by the agent's exited children (py-spy recorders).")
        children.add_metric([], times.children_user + times.children_system)
        rss = GaugeMetricFamily("infersight_agent_resident_memory_bytes", "Agent resident memory.")
        rss.add_metric([], self._process.memory_info().rss)
        peak = GaugeMetricFamily("infersight_agent_peak_resident_memory_bytes", "Agent peak resident memory.")
        peak.add_metric([], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        uptime = GaugeMetricFamily("infersight_agent_uptime_seconds", "Seconds since the agent started.")
        uptime.add_metric([], self._clock() - snap.started)
        windows = CounterMetricFamily("infersight_agent_windows", "Windows collected and stored.")
        windows.add_metric([], snap.windows_written)
        late = CounterMetricFamily("infersight_agent_late_ticks", "Ticks that started later than their interval.")
        late.add_metric([], snap.late_ticks)
        dropped = CounterMetricFamily("infersight_agent_dropped_windows", "Windows lost (not stored).")
        dropped.add_metric([], snap.dropped_windows)
        tick = GaugeMetricFamily("infersight_agent_window_duration_seconds",
                                 "Seconds the last collection tick took to build and store its windows.")
        tick.add_metric([], snap.last_tick_seconds)
        errors = CounterMetricFamily("infersight_agent_errors",
                                     "Failures of the agent's own work (store, discovery, loop, detector, retention, "
                                     "rollup, alerts); a collector's failed reads are in its status page health.",
                                     labels=["component"])
        for part, n in sorted(snap.agent_errors.items()):
            errors.add_metric([part], n)
        missing = CounterMetricFamily("infersight_window_missing_readings",
                                      "Windows recorded without a source's reading: the source failed or cannot "
                                      "measure that target; each window's errors say which.", labels=["source"])
        for source, n in sorted(snap.missing_readings.items()):
            missing.add_metric([source], n)
        up = GaugeMetricFamily("infersight_source_up", "1 when a source or probe is running, else 0; no series "
                               "for one the host has nothing for (no GPU).", labels=["source"])
        for source, health in sorted(snap.health.items()):
            # A CPU-only host has no GPU to watch: a fact, not a source that is down (no alert fires on it).
            if health.state != "absent":
                up.add_metric([source], 1.0 if health.up else 0.0)
        yield from (cpu, children, rss, peak, uptime, windows, late, dropped, tick, errors, missing, up)


def build_registry(state: AgentState) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(TargetCollector(state))
    registry.register(AgentCollector(state))
    return registry
