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


def start_collection(pid: int, metrics_url: str, interval: float) -> Collector:
    """BPF probes + py-spy + psutil + latency for `pid`, as the daemon runs them (needs root)."""
    from agent.collectors import Collectors
    from agent.config import Config, LatencySpec, ProbesConfig, TargetSpec
    from agent.loop import CollectionLoop
    from agent.state import AgentState
    from agent.target_sources import source_factories

    spec = TargetSpec(name="workload", pid=pid, latency=LatencySpec.from_preset("workload", url=metrics_url))
    config = Config(interval_seconds=interval, targets=(spec,))
    state = AgentState()
    collectors = Collectors(ProbesConfig().enabled(), make_sources=lambda t: source_factories(t, config))
    loop = CollectionLoop(specs=[spec], collectors=collectors, state=state, sink=lambda window: None,
                          interval=interval)
    loop.start()
    problems = {name: str(h.reason) for name, h in state.snapshot().health.items()
                if not h.up and not name.startswith("gpu:")}
    return Collector(tick=lambda: loop.tick().windows, close=loop.close, problems=problems)
