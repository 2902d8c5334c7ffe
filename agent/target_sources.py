"""The user-space sources of one target (py-spy, psutil, latency, GPU), by the Window field each fills."""

from __future__ import annotations

from collections.abc import Callable

from agent.collectors import Collectors, SourceFactories
from agent.config import Config, LatencySpec
from agent.presets import PRESETS
from agent.sources.gpu import GpuSource
from agent.sources.latency import LatencySource
from agent.sources.pressure import PressureSource
from agent.sources.process import ProcessSource
from agent.sources.pyspy import PySpySampler
from agent.targets import Member, Target, read_uids

FamilyPids = Callable[[], tuple[int, ...]]


def source_factories(target: Target, config: Config, wants_burst: Callable[[str], bool] | None = None,
                     family_pids: FamilyPids | None = None) -> SourceFactories:
    """Window field -> constructor; the Collectors registry builds them when the target appears.
    `stacks` only when `config.stacks.enabled`; `wants_burst(target name)` switches stack sampling to its
    burst rate (the daemon's BurstPolicy). A family target gets its process and stacks sources per member
    (member_source_factories); `family_pids()` is its current members, whose sockets may answer the scrape."""
    factories: SourceFactories = {"gpu": lambda: GpuSource(target.pid)}
    # PSI of the leader's cgroup (a family's members share it) and the major faults of every current member.
    factories["pressure"] = lambda: PressureSource(target.pid, pids=family_pids)
    if not target.members:
        factories.update(member_source_factories(target, None, config, wants_burst))
    latency = target.spec.latency
    if latency is not None:
        owners = family_pids or (lambda: (target.pid,))
        factories["latency"] = lambda: _latency_source(latency, owners, config.interval_seconds)
    return factories


def member_source_factories(target: Target, member: Member | None, config: Config,
                            wants_burst: Callable[[str], bool] | None = None) -> SourceFactories:
    """The per-process sources (process facts, py-spy) of one member of `target`, or of the target's own process
    when `member` is None. A family's members share the stack sampling rate: each samples at rate / members
    (at least 1 Hz), so a family of N costs what one process did (docs/sources.md "Families")."""
    pid, start_time = (member.pid, member.start_time) if member is not None else (target.pid, target.start_time)
    factories: SourceFactories = {"process": lambda: ProcessSource(pid)}
    stacks = config.stacks
    if stacks.enabled:
        share = max(1, len(target.members))
        trigger = (lambda: wants_burst(target.name)) if wants_burst is not None else None
        # A burst segment longer than a window would leave a regression's windows without stacks; steady ones may
        # span windows (fewer attaches), their stacks coming with the window each ends in.
        segment = min(stacks.segment_seconds, max(1, int(config.interval_seconds)))
        # Steady segments span windows only when asked for longer than burst ones and the windows are no shorter
        # than a burst segment: windows cut shorter (a 2 s eval run) would wait on one recording for many windows,
        # each reading the last recording's stacks (analysis.steady_stacks), so there they stay one window.
        spans = stacks.steady_segment_seconds > stacks.segment_seconds and segment == stacks.segment_seconds
        steady = stacks.steady_segment_seconds if spans else segment
        # py-spy runs as root by pid: only on the process discovery chose, while it runs as the users it ran as
        # when chosen or as allowed users (the daemon's discovery chose only those; `collect --pid N` is root
        # naming that one process), so a target that switches to another user gets no further recorder.
        factories["stacks"] = lambda: PySpySampler(
            pid, rate_hz=max(1, stacks.rate_hz // share), nonblocking=stacks.nonblocking,
            segment_seconds=segment, steady_segment_seconds=steady, burst_rate_hz=max(1, stacks.burst_rate_hz // share),
            burst_hold_segments=stacks.burst_hold_segments, wants_burst=trigger,
            start_time=start_time, allowed_uids=config.allowed_uids | set(read_uids(pid)))
    return factories


def build_collectors(config: Config, wants_burst: Callable[[str], bool] | None = None) -> Collectors:
    """The Collectors registry for `config`: its enabled probes, and each target's sources (per member for a
    family, whose latency scrape may be answered by any current member)."""
    collectors: Collectors

    def target_sources(target: Target) -> SourceFactories:
        return source_factories(target, config, wants_burst, family_pids=lambda: collectors.member_pids(target.key))

    collectors = Collectors(config.probes.enabled(), make_sources=target_sources,
                            make_member_sources=lambda t, m: member_source_factories(t, m, config, wants_burst))
    return collectors


def scrape_deadline(timeout_seconds: float, interval_seconds: float) -> float:
    """A scrape's deadline: its timeout, but never more than half the interval. Each tick waits for every target's
    scrape at once, up to this; the other half is the rest of the tick's work, so a target that answers slowly
    costs its own reading and never another target's window."""
    return min(timeout_seconds, interval_seconds / 2)


def _latency_source(spec: LatencySpec, owners: FamilyPids, interval_seconds: float) -> LatencySource:
    figures = PRESETS[spec.preset].figures if spec.preset else None
    source = LatencySource(spec.url, spec.metric, timeout=scrape_deadline(spec.timeout_seconds, interval_seconds),
                           kind=spec.kind, count_metric=spec.count_metric, unit_seconds=spec.unit_seconds,
                           figures=figures, max_body_bytes=spec.max_body_bytes, max_series=spec.max_series,
                           owner_pids=owners)
    # The baseline scrape, so the first window already has a delta; off the collection thread, since the target
    # may be one that answers slowly (the first read takes it, or says why it failed).
    source.prime(wait=False)
    return source
