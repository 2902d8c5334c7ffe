"""The daemon's target discovery: only trusted users' processes, at most max_targets, and what was left out."""

from __future__ import annotations

from collections.abc import Callable

from agent.config import Config, TargetSpec
from agent.families import Families
from agent.state import AgentState
from agent.targets import Skipped, Target, discover

DiscoverFn = Callable[[list[TargetSpec], dict[str, str]], list[Target]]


def make_discover(config: Config, state: AgentState) -> DiscoverFn:
    """A discover function for CollectionLoop that applies allowed_users and max_targets from `config`
    and publishes each regex target's skipped counts to `state` (the page and /metrics show them). One
    Families serves every discovery, so what family targets found costly (a unit's cgroup, a port's holder)
    is looked up again only when it changed."""
    allowed = config.allowed_uids
    limit = config.max_targets
    families = Families()

    def run(specs: list[TargetSpec], problems: dict[str, str]) -> list[Target]:
        skipped: dict[str, Skipped] = {}
        found = discover(specs, problems=problems, allowed_uids=allowed, max_targets=limit, skipped=skipped,
                         families=families)
        state.set_skipped(skipped)
        return found

    return run
