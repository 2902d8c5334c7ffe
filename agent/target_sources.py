"""Build and read one target's user-space sources (py-spy, psutil, latency, GPU) as one bundle."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent.config import Config
from agent.sources.gpu import GpuSource
from agent.sources.health import Source, SourceHealth
from agent.sources.latency import LatencySource
from agent.sources.process import ProcessSource
from agent.sources.pyspy import PySpySampler
from agent.targets import Target
from probes.errors import ProbeError

log = logging.getLogger("infersight.sources")


class SourceBundle:
    """Window field -> source. A source that failed to start keeps its reason and reports it every window."""

    def __init__(self, factories: dict[str, tuple[str, Callable[[], Source]]]) -> None:
        self._sources: dict[str, Source] = {}
        self._broken: dict[str, SourceHealth] = {}
        self._names: dict[str, str] = {}
        for attr, (name, factory) in factories.items():
            self._names[attr] = name
            try:
                self._sources[attr] = factory()
            except (ProbeError, ValueError, OSError) as exc:
                log.warning("source %s unavailable: %s", name, exc)
                self._broken[attr] = SourceHealth(name=name, state="error", reason=str(exc), errors=1)

    def read(self) -> tuple[dict[str, Any], dict[str, str]]:
        readings: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for attr, source in self._sources.items():
            try:
                readings[attr] = source.read()
            except ProbeError as exc:
                errors[source.name] = str(exc)
        for attr, health in self._broken.items():
            errors[health.name] = health.reason or "unavailable"
        return readings, errors

    def health(self) -> dict[str, dict[str, Any]]:
        out = {h.name: h.to_dict() for h in self._broken.values()}
        for source in self._sources.values():
            out[source.name] = source.health().to_dict()
        return out

    def close(self) -> None:
        for source in self._sources.values():
            source.close()


def make_target_sources(target: Target, config: Config, pyspy: bool = True,
                        wants_burst: Callable[[str], bool] | None = None) -> SourceBundle:
    """`wants_burst(target name)` switches stack sampling to its burst rate (the daemon's BurstPolicy)."""
    factories: dict[str, tuple[str, Callable[[], Source]]] = {
        "process": ("process", lambda: ProcessSource(target.pid)),
        "gpu": ("gpu", lambda: GpuSource(target.pid)),
    }
    if pyspy:
        trigger = (lambda: wants_burst(target.name)) if wants_burst is not None else None
        # A segment longer than a window would leave whole windows without stacks.
        segment = min(config.pyspy_segment_seconds, max(1, int(config.interval_seconds)))
        factories["stacks"] = ("pyspy", lambda: PySpySampler(
            target.pid, rate_hz=config.pyspy_rate_hz, nonblocking=config.pyspy_nonblocking,
            segment_seconds=segment, burst_rate_hz=config.pyspy_burst_rate_hz,
            burst_hold_segments=config.pyspy_burst_hold_segments, wants_burst=trigger))
    latency = target.spec.latency
    if latency is not None:
        factories["latency"] = ("latency", lambda: _latency_source(latency))
    return SourceBundle(factories)


def _latency_source(spec) -> LatencySource:
    source = LatencySource(spec.url, spec.metric, timeout=spec.timeout_seconds, kind=spec.kind,
                           count_metric=spec.count_metric, unit_seconds=spec.unit_seconds)
    try:
        source.prime()  # the baseline scrape, so the first window already has a delta
    except ProbeError as exc:
        log.warning("latency source %s not answering yet: %s", spec.url, exc)
    return source
