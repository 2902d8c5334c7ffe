"""Profiles for flame graphs captured live from a pid (stored ones: analysis.flamegraph.stored)."""

from __future__ import annotations

import time
from collections.abc import Callable

from analysis.flamegraph import Profile
from analysis.flamegraph.export import KINDS, PROFILE_KINDS


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
