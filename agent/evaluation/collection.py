"""The one place the evaluation touches the agent's collection: watch one pid, hand back its Windows per tick."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from analysis.window import Window


@dataclass
class Collector:
    """tick() -> this tick's Windows of the watched server; close() stops probes and samplers."""

    tick: Callable[[], list[Window]]
    close: Callable[[], None]
    # Sources that could not start (name -> reason), for the run's log.
    problems: dict[str, str]


def start_collection(pid: int, metrics_url: str, interval: float, children: bool = False) -> Collector:
    """BPF probes + py-spy + psutil + latency for `pid` (with `children`, and every process it starts: a server of
    several processes, `serve --engine-process`), as the daemon runs them (needs root)."""
    from agent.config import Config, LatencySpec, TargetSpec
    from agent.single_target import watch_one

    spec = TargetSpec(name="workload", pid=pid, children=children,
                      latency=LatencySpec.from_preset("workload", url=metrics_url))
    watch = watch_one(Config(interval_seconds=interval, targets=(spec,)))
    return Collector(tick=lambda: watch.tick().windows, close=watch.close, problems=watch.problems())
