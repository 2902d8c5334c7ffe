"""One target watched without the daemon: the probes, sources and loop that `collect`, `eval` and `loadtest` share."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.collectors import exits_probe
from agent.config import Config, FieldError, ProbesConfig, TargetSpec
from agent.families import Families
from agent.loop import CollectionLoop, TickReport, WindowSink
from agent.state import AgentState
from agent.target_sources import build_collectors
from agent.targets import discover

# The command line's selectors (docs/config.md, "Families"): option -> TargetSpec key.
SELECTOR_OPTIONS = {"pid": "pid", "unit": "systemd_unit", "cgroup": "cgroup", "container": "container", "port": "port"}


def _selector_value(key: str, kind: type = str):
    """An argparse type that checks one selector's value as the config would (same one-line message)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a string'}, "
                                             f"got {text!r}") from None
        try:
            TargetSpec(name="cli", **{key: value})
        except FieldError as exc:
            raise argparse.ArgumentTypeError(exc.problem) from None
        return value
    return parse


def add_selector_arguments(parser: argparse.ArgumentParser, group: argparse._MutuallyExclusiveGroup,
                           pid_help: str) -> None:
    """`--pid N [--children]`, `--unit NAME`, `--cgroup PATH`, `--container ID`, `--port N` in `group` (one of
    them), as `collect` and `loadtest` take them."""
    group.add_argument("--pid", type=_selector_value("pid", int), help=pid_help)
    group.add_argument("--unit", type=_selector_value("systemd_unit"), metavar="NAME",
                       help="every process of a systemd unit (its cgroup v2), e.g. vllm.service")
    group.add_argument("--cgroup", type=_selector_value("cgroup"), metavar="PATH",
                       help="every process in a cgroup v2 directory and below (a path under the mount, or relative to it)")
    group.add_argument("--container", type=_selector_value("container"), metavar="ID",
                       help="every process of a container (Docker, containerd, CRI-O, Podman) by id or name prefix")
    group.add_argument("--port", type=_selector_value("port", int), metavar="N",
                       help="the process listening on TCP port N, and its descendants")
    parser.add_argument("--children", action="store_true", help="with --pid: the process and all its descendants")


class SelectorError(ValueError):
    """The selector options are misused; the message is one line (the command exits 2)."""


def selector_spec(args: argparse.Namespace) -> TargetSpec | None:
    """The TargetSpec the selector options name (None when none is given); SelectorError on misuse."""
    given = [(option, getattr(args, option)) for option in SELECTOR_OPTIONS if getattr(args, option, None) is not None]
    if getattr(args, "children", False) and [o for o, _ in given] != ["pid"]:
        raise SelectorError("--children goes with --pid (--unit, --cgroup, --container and --port take the whole "
                            "family already)")
    if not given:
        return None
    option, value = given[0]
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{option}{value}" if option in ("pid", "port") else
                  f"{option}-{str(value).strip('/')}")[:64]
    extra = {"children": True} if option == "pid" and args.children else {}
    return TargetSpec(name=name, **{SELECTOR_OPTIONS[option]: value}, **extra)


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
    collectors = build_collectors(config)
    # One Families for the run: a unit's or container's cgroup and a port's holder are looked up once.
    families = Families()
    loop = CollectionLoop(specs=list(config.targets), collectors=collectors, state=state, sink=sink,
                          interval=interval if interval is not None else config.interval_seconds,
                          exits=exits_probe(config.probes.exits),
                          discover_fn=lambda specs, problems: discover(specs, problems=problems, families=families))
    loop.start()
    return SingleTarget(name=config.targets[0].name, loop=loop, state=state)
