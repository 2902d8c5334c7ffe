"""The user-space sources of one target (py-spy, psutil, latency, GPU), by the Window field each fills."""

from __future__ import annotations

from collections.abc import Callable

from agent.collectors import SourceFactories
from agent.config import Config, LatencySpec
from agent.presets import PRESETS
from agent.sources.gpu import GpuSource
from agent.sources.latency import LatencySource
from agent.sources.process import ProcessSource
from agent.sources.pyspy import PySpySampler
from agent.targets import Target, read_uids


def source_factories(target: Target, config: Config,
                     wants_burst: Callable[[str], bool] | None = None) -> SourceFactories:
    """Window field -> constructor; the Collectors registry builds them when the target appears.
    `stacks` only when `config.stacks.enabled`; `wants_burst(target name)` switches stack sampling to its
    burst rate (the daemon's BurstPolicy)."""
    factories: SourceFactories = {
        "process": lambda: ProcessSource(target.pid),
        "gpu": lambda: GpuSource(target.pid),
    }
    stacks = config.stacks
    if stacks.enabled:
        trigger = (lambda: wants_burst(target.name)) if wants_burst is not None else None
        # A segment longer than a window would leave whole windows without stacks.
        segment = min(stacks.segment_seconds, max(1, int(config.interval_seconds)))
        # py-spy runs as root by pid: only on the process discovery chose, while it runs as the users it ran as
        # when chosen or as allowed users (the daemon's discovery chose only those; `collect --pid N` is root
        # naming that one process), so a target that switches to another user gets no further recorder.
        factories["stacks"] = lambda: PySpySampler(
            target.pid, rate_hz=stacks.rate_hz, nonblocking=stacks.nonblocking,
            segment_seconds=segment, burst_rate_hz=stacks.burst_rate_hz,
            burst_hold_segments=stacks.burst_hold_segments, wants_burst=trigger,
            start_time=target.start_time, allowed_uids=config.allowed_uids | set(read_uids(target.pid)))
    latency = target.spec.latency
    if latency is not None:
        factories["latency"] = lambda: _latency_source(latency, target, config.interval_seconds)
    return factories


def scrape_deadline(timeout_seconds: float, interval_seconds: float) -> float:
    """A scrape's deadline: its timeout, but never more than half the interval. Each tick waits for every target's
    scrape at once, up to this; the other half is the rest of the tick's work, so a target that answers slowly
    costs its own reading and never another target's window."""
    return min(timeout_seconds, interval_seconds / 2)


def _latency_source(spec: LatencySpec, target: Target, interval_seconds: float) -> LatencySource:
    figures = PRESETS[spec.preset].figures if spec.preset else None
    source = LatencySource(spec.url, spec.metric, timeout=scrape_deadline(spec.timeout_seconds, interval_seconds),
                           kind=spec.kind, count_metric=spec.count_metric, unit_seconds=spec.unit_seconds,
                           figures=figures, max_body_bytes=spec.max_body_bytes, max_series=spec.max_series,
                           # The target is one process today; a family's pids go here when targets are families.
                           owner_pids=lambda: (target.pid,))
    # The baseline scrape, so the first window already has a delta; off the collection thread, since the target
    # may be one that answers slowly (the first read takes it, or says why it failed).
    source.prime(wait=False)
    return source
