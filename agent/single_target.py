"""One target watched without the daemon: the probes, sources and loop that `collect`, `eval` and `loadtest` share."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.collectors import Collectors, exits_probe
from agent.config import Config, ProbesConfig
from agent.loop import CollectionLoop, TickReport, WindowSink
from agent.state import AgentState
from agent.target_sources import source_factories


def probes_config(names: Iterable[str]) -> ProbesConfig:
    """The [probes] table that loads exactly the window probes `names` (the exits probe stays on)."""
    wanted = set(names)
    return ProbesConfig(**{name: name in wanted for name in ProbesConfig().enabled()})


@dataclass
class SingleTarget:
    """The loop over `config.targets[0]`, started; tick() ends a window, close() unloads everything."""

    name: str
    loop: CollectionLoop
    state: AgentState

    def tick(self) -> TickReport:
        return self.loop.tick()

    def close(self) -> None:
        self.loop.close()

    def problems(self) -> dict[str, str]:
        """Collectors that are not running, by health name, as "state: reason". A host without a GPU (health
        "absent") is a normal host, not a problem: each window says so."""
        return {name: f"{h.state}: {h.reason}" for name, h in self.state.snapshot().health.items()
                if not h.up and h.state != "absent"}

    def target_detail(self) -> str | None:
        """What the loop last said of the target: its command line while watched, how it ended once down."""
        status = self.state.snapshot().targets.get(self.name)
        return status.detail if status is not None else None


def watch_one(config: Config, sink: WindowSink = lambda window: None, interval: float | None = None) -> SingleTarget:
    """Start the loop for the one target of `config`, as the daemon runs its collectors (needs root for BPF).

    `interval` is the loop's own tick period when it differs from the config's (a load test cuts its windows by
    hand)."""
    if len(config.targets) != 1:
        raise ValueError(f"watch_one takes a config with exactly one target, got {len(config.targets)}")
    state = AgentState()
    collectors = Collectors(config.probes.enabled(), make_sources=lambda t: source_factories(t, config))
    loop = CollectionLoop(specs=list(config.targets), collectors=collectors, state=state, sink=sink,
                          interval=interval if interval is not None else config.interval_seconds,
                          exits=exits_probe(config.probes.exits))
    loop.start()
    return SingleTarget(name=config.targets[0].name, loop=loop, state=state)
