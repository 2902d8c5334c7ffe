"""Windows from the target during a load test: the agent's probes and sources, cut once per step."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from analysis.window import Window

log = logging.getLogger("infersight.loadtest")


@dataclass
class Collection:
    """`cut()` ends the current window and starts the next; `problems` are the sources that could not start."""

    cut: Callable[[], Window | None]
    close: Callable[[], None]
    problems: dict[str, str] = field(default_factory=dict)


def open_collection(pid: int, probes: list[str], pyspy: bool, pyspy_rate: int, spec=None) -> Collection:
    """The one place that knows the agent's collection loop (the lead adapts it when the loop's API moves).

    Builds a loop for this one pid (or the family `spec` selects, led by `pid`), starts its probes and
    sources, and hands back a cut function that runs one tick and returns that tick's window of the target.
    """
    from agent.config import Config, StacksConfig, TargetSpec
    from agent.single_target import probes_config, watch_one

    spec = spec if spec is not None else TargetSpec(name=f"pid{pid}", pid=pid)
    # 1 s py-spy segments: a step's stacks must be cut at its end, and a step may be shorter than the daemon's
    # 5 s segment.
    watch = watch_one(Config(interval_seconds=5.0, probes=probes_config(probes), targets=(spec,),
                             stacks=StacksConfig(enabled=pyspy, rate_hz=pyspy_rate, segment_seconds=1,
                                                 steady_segment_seconds=1)))

    def cut() -> Window | None:
        report = watch.tick()
        return next((w for w in report.windows if w.pid == pid), None)

    return Collection(cut=cut, close=watch.close, problems=watch.problems())


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) so far of each thread of `pid`; empty when it is gone."""
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return {}


def busiest_thread(before: dict[int, float], after: dict[int, float], seconds: float) -> tuple[int, float] | None:
    """(tid, cores) of the thread that used the most CPU between two thread_cpu() readings."""
    if seconds <= 0:
        return None
    deltas = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    if not deltas:
        return None
    tid = max(deltas, key=lambda t: deltas[t])
    return tid, max(0.0, deltas[tid]) / seconds
