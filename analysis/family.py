"""A family target's readings: each member's own, summed into the family's (docs/window.md "members").

The detector judges a family as one server, so the Window's reading fields hold the family's totals; each
member keeps a compact summary (MemberReading) so a cause can name the process its evidence is in. Stacks of a
family carry the member's role as their root frame, so a flame graph (and a diff of two) shows which process
grew; the role, not the pid, so that a member restarted under a new pid keeps its frames.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from analysis import culprits
from analysis.features import is_idle_loop
from analysis.waits import by_kind
from analysis.window import (
    DeliveryReading,
    GcReading,
    Log2Histogram,
    MemberReading,
    OffCpuReading,
    ProcessReading,
    RunQueueReading,
    StackReading,
    SyscallReading,
    TcpReading,
    measured_sum,
)

# Readings measured per process, summed over a family's members. Latency and GPU are the family's own (read
# from the leader's server and the host), never per member.
PER_MEMBER: tuple[str, ...] = ("syscalls", "offcpu", "gc", "tcp", "runqueue", "process", "stacks", "delivery")


def _hist_sum(hists: Sequence[Log2Histogram], unit: str) -> Log2Histogram:
    out = Log2Histogram(unit=unit)
    for h in hists:
        out.add(h)
    return out


def _rooted(folded: Mapping[str, int], role: str) -> dict[str, int]:
    return {f"{role};{stack}": n for stack, n in folded.items()}


def _add_folded(into: dict[str, int], folded: Mapping[str, int]) -> None:
    for stack, n in folded.items():
        into[stack] = into.get(stack, 0) + n


def _syscalls(parts: Sequence[tuple[str, SyscallReading]]) -> SyscallReading:
    out = SyscallReading()
    for _, r in parts:
        for name, n in r.counts.items():
            out.counts[name] = out.counts.get(name, 0) + n
        for name, h in r.latency.items():
            out.latency.setdefault(name, Log2Histogram(unit=h.unit)).add(h)
    return out


def _offcpu(parts: Sequence[tuple[str, OffCpuReading]]) -> OffCpuReading:
    out = OffCpuReading(seconds=sum(r.seconds for _, r in parts),
                        histogram=_hist_sum([r.histogram for _, r in parts], "us"))
    for role, r in parts:
        out.by_thread.update(r.by_thread)  # thread ids are unique across processes
        _add_folded(out.stacks, _rooted(r.stacks, role))
    return out


def _gc(parts: Sequence[tuple[str, GcReading]]) -> GcReading:
    return GcReading(collections=sum(r.collections for _, r in parts),
                     pause_seconds=sum(r.pause_seconds for _, r in parts),
                     max_pause_seconds=max((r.max_pause_seconds for _, r in parts), default=0.0),
                     histogram=_hist_sum([r.histogram for _, r in parts], "us"))


def _tcp(parts: Sequence[tuple[str, TcpReading]]) -> TcpReading:
    return TcpReading(retransmits=sum(r.retransmits for _, r in parts),
                      flows=[copy.copy(f) for _, r in parts for f in r.flows])


def _runqueue(parts: Sequence[tuple[str, RunQueueReading]]) -> RunQueueReading:
    charged = [r.charged_seconds for _, r in parts]
    # The members' own processes are re-marked "self" by the collector, which knows their pids (culprits.merge).
    return RunQueueReading(histogram=_hist_sum([r.histogram for _, r in parts], "us"),
                           total_seconds=sum(r.total_seconds for _, r in parts),
                           culprits=culprits.merge([r.culprits for _, r in parts], ()),
                           charged_seconds=None if None in charged else sum(c for c in charged if c is not None))


def _process(parts: Sequence[tuple[str, ProcessReading]]) -> ProcessReading:
    readings = [r for _, r in parts]
    return ProcessReading(cpu_seconds=sum(r.cpu_seconds for r in readings),
                          rss_bytes=sum(r.rss_bytes for r in readings),
                          threads=sum(r.threads for r in readings),
                          voluntary_ctx_switches=sum(r.voluntary_ctx_switches for r in readings),
                          involuntary_ctx_switches=sum(r.involuntary_ctx_switches for r in readings),
                          fds=sum(r.fds for r in readings),
                          stopped_threads=measured_sum([r.stopped_threads for r in readings]),
                          disk_wait_threads=measured_sum([r.disk_wait_threads for r in readings]))


def _stacks(parts: Sequence[tuple[str, StackReading]]) -> StackReading:
    out = StackReading(rate_hz=sum(r.rate_hz for _, r in parts), samples=sum(r.samples for _, r in parts))
    for role, r in parts:
        _add_folded(out.active, _rooted(r.active, role))
        _add_folded(out.idle, _rooted(r.idle, role))
    return out


def _delivery(parts: Sequence[tuple[str, DeliveryReading]]) -> DeliveryReading:
    readings = [r for _, r in parts]
    buckets: dict[str, float] = {}
    for r in readings:
        for k, n in r.buckets.items():
            buckets[k] = buckets.get(k, 0.0) + n
    srtt = [(r.srtt_mean_seconds, r.replies) for r in readings if r.srtt_mean_seconds is not None and r.replies]
    replies = sum(n for _, n in srtt)
    return DeliveryReading(replies=sum(r.replies for r in readings),
                           retransmitted=sum(r.retransmitted for r in readings),
                           rto_replies=sum(r.rto_replies for r in readings), buckets=buckets,
                           delivery_seconds=sum(r.delivery_seconds for r in readings),
                           srtt_mean_seconds=sum(s * n for s, n in srtt) / replies if replies else None,
                           retransmits=sum(r.retransmits for r in readings),
                           rto_stall_seconds=sum(r.rto_stall_seconds for r in readings),
                           not_server=sum(r.not_server for r in readings),
                           synack_retransmits=sum(r.synack_retransmits for r in readings),
                           connects=sum(r.connects for r in readings),
                           slow_connects=sum(r.slow_connects for r in readings),
                           connect_wait_seconds=sum(r.connect_wait_seconds for r in readings),
                           first_requests=(None if any(r.first_requests is None for r in readings)
                                           else sum(r.first_requests for r in readings)),
                           late_requests=sum(r.late_requests for r in readings),
                           request_wait_seconds=sum(r.request_wait_seconds for r in readings),
                           idle_connects=sum(r.idle_connects for r in readings))


_MERGE: dict[str, Callable[[Sequence[tuple[str, Any]]], Any]] = {
    "syscalls": _syscalls, "offcpu": _offcpu, "gc": _gc, "tcp": _tcp, "runqueue": _runqueue,
    "process": _process, "stacks": _stacks, "delivery": _delivery,
}


def family_total(field: str, parts: Sequence[tuple[str, Any]]) -> Any:
    """The family's reading of `field` from its members' (role, reading) pairs: counts and times summed,
    histograms added, maxima taken, stacks under their member's role. Only members that measured it are
    passed; a member that did not says why in its own MemberReading."""
    if field not in _MERGE:
        raise ValueError(f"{field!r} is not measured per member; per member: {PER_MEMBER}")
    return _MERGE[field](parts)


def _app_wait(stacks: StackReading | None) -> float | None:
    """Threads waiting inside the member's own code per py-spy tick, as analysis.features reads a process: per
    member, because the members are sampled each at its own rate (one member's waits over the family's ticks would
    dilute them by the number of members)."""
    if stacks is None or not stacks.samples:
        return None
    return sum(n for stack, n in stacks.idle.items() if not is_idle_loop(stack.rsplit(";", 1)[-1])) / stacks.samples


def member_summary(pid: int, role: str, readings: Mapping[str, Any], errors: Mapping[str, str]) -> MemberReading:
    """One member's figures for the Window: what its own probes and sources measured, None (with the reason in
    `errors`) for what they did not."""
    syscalls: SyscallReading | None = readings.get("syscalls")
    offcpu: OffCpuReading | None = readings.get("offcpu")
    gc: GcReading | None = readings.get("gc")
    tcp: TcpReading | None = readings.get("tcp")
    runqueue: RunQueueReading | None = readings.get("runqueue")
    process: ProcessReading | None = readings.get("process")
    stacks: StackReading | None = readings.get("stacks")
    return MemberReading(
        pid=pid, role=role,
        cpu_seconds=process.cpu_seconds if process else None,
        rss_bytes=process.rss_bytes if process else None,
        syscalls=dict(syscalls.counts) if syscalls else None,
        offcpu_seconds=offcpu.seconds if offcpu else None,
        # Microseconds per wait kind (analysis.waits), the page's and the detector's one classifier.
        offcpu_by_kind={k: v / 1e6 for k, v in by_kind(offcpu.stacks).items() if v} if offcpu else None,
        gc_collections=gc.collections if gc else None,
        gc_pause_seconds=gc.pause_seconds if gc else None,
        runqueue_seconds=runqueue.total_seconds - culprits.own_seconds(runqueue) if runqueue else None,
        retransmits=tcp.retransmits if tcp else None,
        stack_samples=(sum(stacks.active.values()) + sum(stacks.idle.values())) if stacks else None,
        app_wait_threads=_app_wait(stacks),
        errors={k: v for k, v in errors.items() if k in PER_MEMBER},
    )
