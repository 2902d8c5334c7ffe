"""The run-queue probe's culprits as the detector and its readers use them: merged over a family, the agent's own
share taken out, and the neighbours named in a sentence."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from analysis.window import Culprit, RunQueueReading

# Neighbours kept per family window, as per process (probes/runqlat.py RunqlatConfig.top_culprits).
TOP = 5


def merge(lists: Iterable[list[Culprit]], members: Collection[int], top: int = TOP) -> list[Culprit]:
    """A family's culprits from its members' lists: one row per process, seconds summed; a member that delayed
    another is the family's own work ("self"), not a neighbour. The top neighbours, then every other kind."""
    rows: dict[int, Culprit] = {}
    for culprits in lists:
        for c in culprits:
            if c.pid in rows:
                rows[c.pid].seconds += c.seconds
            else:
                rows[c.pid] = Culprit(**{**c.__dict__})
            if c.pid in members:
                rows[c.pid].kind = "self"
    ranked = sorted(rows.values(), key=lambda c: -c.seconds)
    neighbours = [c for c in ranked if not c.kind][:top]
    return sorted(neighbours + [c for c in ranked if c.kind], key=lambda c: -c.seconds)


def own_seconds(reading: RunQueueReading) -> float:
    """The target's wait the agent itself caused (its own CPU and py-spy's on the target's CPUs)."""
    return sum(c.seconds for c in reading.culprits if c.kind == "agent")


def neighbours(reading: RunQueueReading) -> list[Culprit]:
    """Other processes that ran while the target waited, largest first: not idle, not the target, not the agent."""
    return [c for c in reading.culprits if not c.kind]


def describe(c: Culprit, wait_seconds: float, duration: float) -> str:
    """'pid 9911 `python3 hog.py` (user bob) ran during 71 % of the server's run-queue wait, 1.9 s/s'."""
    what = c.cmdline or c.comm
    user = f" (user {c.user})" if c.user else ""
    gone = f" [{c.reason}]" if c.reason else ""
    share = 100 * c.seconds / wait_seconds if wait_seconds > 0 else 0.0
    rate = c.seconds / duration if duration > 0 else 0.0
    return (f"pid {c.pid} `{what[:80]}`{user}{gone} ran during {share:.0f} % of the server's run-queue wait "
            f"({rate:.2f} s of waiting per second)")
