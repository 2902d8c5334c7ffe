"""Profiles for flame graphs: merged from the store over a time range, or captured live from a pid."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from analysis.flamegraph import Profile
from analysis.flamegraph.export import KINDS, PROFILE_KINDS


def from_store(store: Any, target: str, since: float | None, until: float | None, kind: str = "active") -> Profile:
    """Every window of `target` overlapping [since, until), merged."""
    if kind not in PROFILE_KINDS:
        raise ValueError(f"profile kind must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")
    if since is not None and until is not None and since >= until:
        raise ValueError(f"the range is empty: from {since!r} is not before to {until!r}")
    folded = store.profiles(target, since=since, until=until, kind=kind)
    return Profile.from_folded_dict(folded, unit=KINDS[kind].unit, start=since, end=until)


def capture_live(pid: int, duration: float, kind: str = "active", rate_hz: int = 49,
                 sleep: Callable[[float], None] = time.sleep) -> Profile:
    """Sample `pid` for `duration` seconds: py-spy for Python stacks, the off-CPU probe for kernel stacks."""
    if kind not in PROFILE_KINDS:
        raise ValueError(f"profile kind must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")
    start = time.time()
    if kind == "offcpu":
        from probes.offcpu import OffCpuProbe

        probe = OffCpuProbe()
        probe.start([pid])
        try:
            sleep(duration)
            reading = probe.read().get(pid)
        finally:
            probe.stop()
        folded = reading.stacks if reading else {}
    else:
        from agent.sources.pyspy import PySpySampler

        # A live capture is short and asked for: full rate from the start, in 1 s segments.
        sampler = PySpySampler(pid, rate_hz=rate_hz, burst_rate_hz=rate_hz, segment_seconds=1)
        try:
            sleep(duration)
            # The sampler records in 1 s segments: this holds every segment that finished within `duration`.
            stacks = sampler.read()
        finally:
            sampler.close()
        folded = stacks.active if kind == "active" else stacks.idle
    return Profile.from_folded_dict(folded, unit=KINDS[kind].unit, start=start, end=time.time())
