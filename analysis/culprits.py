"""The run-queue probe's culprits as the detector and its readers use them: merged over a family, the agent's own
share taken out, and the neighbours named in a sentence."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from analysis.regression import Cause, Neighbour
from analysis.window import Culprit, RunQueueReading, Window

# Neighbours kept per family window, as per process (probes/runqlat.py RunqlatConfig.top_culprits).
TOP = 5
# Neighbours a cpu_contention cause names in its evidence (all TOP are in its `neighbours`).
NAMED = 3


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


def sample(window: Window) -> dict[str, Any] | None:
    """What the detector keeps of a window's culprits among its per-window values (JSON: they travel in its saved
    state): the target's wait less the agent's share, the window's length, and its neighbours."""
    rq = window.runqueue
    if rq is None or rq.charged_seconds is None:
        return None  # not measured (an older recording, culprits off): nothing to name
    return {"wait": max(rq.total_seconds - own_seconds(rq), 0.0), "duration": window.duration,
            "top": [{"pid": c.pid, "comm": c.comm, "cmdline": c.cmdline, "user": c.user, "seconds": c.seconds}
                    for c in neighbours(rq)]}


# Neighbours an episode's pooled culprits keep (see `pooled`): far more than TOP, so that a process that led the
# wait in the episode's early windows keeps its seconds while others burst later, and still bounded for an episode
# of hours (it travels in the detector's saved state).
POOLED = 32


def pooled(samples: Iterable[dict[str, Any]], into: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The culprits of `samples` (per-window values, as `sample` keeps them) summed into one sample: waits and
    durations added, each neighbour's seconds added by pid, the POOLED largest kept. Added to `into` when given (an
    episode's culprits so far); None when no window measured them. The detector names an episode's neighbours from
    the whole episode this way, not from its last few windows: a neighbour that held the CPU through the episode
    leads it even when another process bursts in its latest windows."""
    acc = None if into is None else {"wait": into["wait"], "duration": into["duration"]}
    rows: dict[int, dict[str, Any]] = {} if into is None else {row["pid"]: dict(row) for row in into["top"]}
    for s in samples:
        kept = s.get("culprits")
        if not isinstance(kept, dict):
            continue
        if acc is None:
            acc = {"wait": 0.0, "duration": 0.0}
        acc["wait"] += kept["wait"]
        acc["duration"] += kept["duration"]
        for c in kept["top"]:
            row = rows.setdefault(c["pid"], {**c, "seconds": 0.0})
            row["seconds"] += c["seconds"]
    if acc is None:
        return None
    acc["top"] = sorted(rows.values(), key=lambda r: -r["seconds"])[:POOLED]
    return acc


def named(cause: Cause, samples: Sequence[dict[str, Any]]) -> Cause:
    """A cpu_contention cause with the neighbours that held the CPU over the episode's windows, in its evidence
    and its `neighbours`; any other cause, or one with no culprit measured, as it is."""
    summed = pooled(samples) if cause.label == "cpu_contention" else None
    if summed is None:
        return cause
    wait, duration = summed["wait"], summed["duration"]
    ranked = summed["top"][:TOP]
    if not ranked or wait <= 0:
        return cause
    found = tuple(Neighbour(pid=r["pid"], comm=r["comm"], seconds=round(r["seconds"], 4),
                            share=round(min(r["seconds"] / wait, 1.0), 4), cmdline=r["cmdline"], user=r["user"])
                  for r in ranked)
    words = "; ".join(describe(Culprit(pid=n.pid, comm=n.comm, seconds=n.seconds, cmdline=n.cmdline, user=n.user),
                               wait, duration) for n in found[:NAMED])
    return dataclasses.replace(cause, evidence=f"{cause.evidence}; {words}", neighbours=found)


@dataclasses.dataclass(frozen=True)
class Leader:
    """The neighbour the target's run-queue wait was charged to most over a run of windows (see `leader`)."""

    pid: int
    comm: str
    cmdline: str | None
    user: str | None
    seconds: float  # of the target's wait charged to it, summed over the windows
    wait: float  # the target's wait (less the agent's share), summed over the same windows
    windows: int  # windows in which it was among the target's neighbours
    measured: int  # windows with culprits measured
    runner_up: float  # seconds charged to the next neighbour

    def words(self) -> str:
        ahead = f"x{self.seconds / self.runner_up:.1f} the next one's" if self.runner_up > 0 else "no other neighbour"
        return (f"one neighbour led the server's run-queue wait: pid {self.pid} `{self.comm}`, among its neighbours "
                f"in {self.windows} of {self.measured} windows ({ahead})")


def leader(samples: Sequence[dict[str, Any]], min_windows: int, lead: float) -> Leader | None:
    """The one neighbour behind the target's run-queue wait over these windows, or None: the process charged the
    most of it (summed by pid over the windows that measured culprits), present among the neighbours in at least
    min_windows windows (a process that persisted, not one burst), and charged at least `lead` times the next
    neighbour (one process to blame, not a crowd of tenants that come and go). Never the target's own processes, the
    agent or the idle task: `top` holds neighbours only (see `sample`)."""
    kept = [s["culprits"] for s in samples if isinstance(s.get("culprits"), dict)]
    if len(kept) < min_windows:
        return None
    rows: dict[int, dict[str, Any]] = {}
    for k in kept:
        for c in k["top"]:
            row = rows.setdefault(c["pid"], {**c, "seconds": 0.0, "windows": 0})
            row["seconds"] += c["seconds"]
            row["windows"] += 1
    ranked = sorted(rows.values(), key=lambda r: (-r["seconds"], r["pid"]))
    if not ranked or ranked[0]["seconds"] <= 0 or ranked[0]["windows"] < min_windows:
        return None
    top, runner_up = ranked[0], ranked[1]["seconds"] if len(ranked) > 1 else 0.0
    if top["seconds"] < lead * runner_up:
        return None
    return Leader(pid=top["pid"], comm=top["comm"], cmdline=top["cmdline"], user=top["user"], seconds=top["seconds"],
                  wait=sum(k["wait"] for k in kept), windows=top["windows"], measured=len(kept), runner_up=runner_up)


def present(sample: dict[str, Any], pid: int) -> bool:
    """Whether `pid` is among the neighbours of one window's kept culprits (False where none were measured)."""
    kept = sample.get("culprits")
    return isinstance(kept, dict) and any(c["pid"] == pid for c in kept["top"])
