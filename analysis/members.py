"""Which process of a family a cause lives in: each member's share of the cause's own measure, against its baseline.

The detector ranks causes on the family's totals (analysis.family); a regression of a service made of several
processes must also say where the evidence is ("GC pause in pid 4242 (VLLM::EngineCore)"). Per cause label there is
one measure per member, per second of window. The member named is the one whose measure grew most over its own
baseline (a slow moving average over healthy windows, kept per role so that a member restarted under a new pid keeps
it); with no baseline yet, the one with the most of it. Growth, not level: an engine always uses more CPU than its API
front, so the front's new CPU is the news when the front is where it grew.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from analysis.cause_signals import BLOCKED_KINDS
from analysis.own_syscalls import workload_counts
from analysis.robust import median
from analysis.window import MemberReading, Window

# A healthy window moves a member's baseline this far towards its value: ~20 windows of memory.
BASELINE_WEIGHT = 0.05
# Roles kept per target: a family is capped by max_processes, and roles repeat (gunicorn's workers share theirs).
MAX_ROLES = 256


def _per_second(value: float | None, duration: float) -> float | None:
    return None if value is None or duration <= 0 else value / duration


def _measure(label: str, m: MemberReading, duration: float) -> float | None:
    """The member's own measure of what `label` (a cause) reads, per second of window; None when not measured."""
    if label == "gc":
        return _per_second(m.gc_pause_seconds, duration)
    if label in ("lock", "blocked"):
        if m.offcpu_by_kind is None:
            return None
        kinds = ("futex",) if label == "lock" else BLOCKED_KINDS
        return _per_second(sum(m.offcpu_by_kind.get(k, 0.0) for k in kinds), duration)
    if label == "syscalls":
        return _per_second(None if m.syscalls is None else float(sum(workload_counts(m.syscalls).values())), duration)
    if label == "network":
        return _per_second(None if m.retransmits is None else float(m.retransmits), duration)
    if label == "cpu_contention":
        return _per_second(m.runqueue_seconds, duration)
    if label == "compute":
        return _per_second(m.cpu_seconds, duration)
    return None


LABELS = ("gc", "lock", "blocked", "syscalls", "network", "cpu_contention", "compute")


def member_measures(window: Window) -> dict[str, dict]:
    """str(pid) -> {"role": its role, label: its measure per second or None}, one row per member (a JSON object's
    keys are strings: the rows travel in the detector's saved state). Empty for a single-process window."""
    return {str(m.pid): {"role": m.role, **{label: _measure(label, m, window.duration) for label in LABELS}}
            for m in window.members}


class MemberBaseline:
    """Per role and cause label, one member's usual measure: an exponential moving average over healthy windows of
    the role's mean per process (gunicorn's four workers share a role; each is judged against one worker's usual)."""

    def __init__(self) -> None:
        self.usual: dict[str, dict[str, float]] = {}

    def learn(self, measures: Mapping[str, Mapping]) -> None:
        by_role: dict[str, dict[str, list[float]]] = {}
        for row in measures.values():
            values = by_role.setdefault(str(row["role"]), {})
            for label in LABELS:
                if row.get(label) is not None:
                    values.setdefault(label, []).append(float(row[label]))
        for role, values in by_role.items():
            if role not in self.usual and len(self.usual) >= MAX_ROLES:
                continue
            usual = self.usual.setdefault(role, {})
            for label, xs in values.items():
                value = sum(xs) / len(xs)
                usual[label] = value if label not in usual else usual[label] + BASELINE_WEIGHT * (value - usual[label])

    def to_dict(self) -> dict:
        return {role: dict(row) for role, row in self.usual.items()}

    def load(self, data: Mapping[str, Mapping[str, float]]) -> None:
        self.usual = {str(role): {str(k): float(v) for k, v in row.items() if k in LABELS}
                      for role, row in list(data.items())[:MAX_ROLES]}


@dataclass(frozen=True)
class Located:
    """Where a cause's evidence is: the member, its measure now and as usual (per second), its share of the growth."""

    pid: int
    role: str
    value: float
    usual: float | None
    share: float
    of_rise: bool  # share of the family's rise over the usual; else of its total (nothing rose)

    def words(self, label: str) -> str:
        scale, unit = _UNITS[label]
        usual = f" vs {self.usual * scale:.3g}{unit} usual" if self.usual is not None else ""
        of = "rise" if self.of_rise else "total"
        return f"in pid {self.pid} ({self.role}): {self.value * scale:.3g}{unit}{usual}, {self.share:.0%} of the family's {of}"


_UNITS: dict[str, tuple[float, str]] = {
    "gc": (1000, " ms/s"), "lock": (1, " s/s"), "blocked": (1, " s/s"), "syscalls": (1, "/s"),
    "network": (1, " retransmits/s"), "cpu_contention": (1, " s/s run-queue wait"), "compute": (1, " CPU s/s"),
}


def locate(label: str, samples: Sequence[Mapping], baseline: MemberBaseline) -> Located | None:
    """The member `label`'s evidence is in, over the episode's windows (`samples`, each with a "members" entry from
    member_measures); None for a single-process target or a family of one process (it is the target), a label no
    member measures, or no member that has any."""
    if label not in LABELS:
        return None
    series: dict[int, list[float]] = {}
    roles: dict[int, str] = {}
    seen: set[int] = set()
    for sample in samples:
        for pid, row in (sample.get("members") or {}).items():
            seen.add(int(pid))
            if row.get(label) is not None:
                series.setdefault(int(pid), []).append(float(row[label]))
                roles[int(pid)] = str(row["role"])
    if len(seen) < 2 or not series:
        return None
    now = {pid: median(xs) for pid, xs in series.items()}
    usual = {pid: baseline.usual.get(roles[pid], {}).get(label) for pid in now}
    rise = {pid: now[pid] - (usual[pid] or 0.0) for pid in now}
    total = sum(max(r, 0.0) for r in rise.values())
    if total > 0:
        pid = max(rise, key=lambda p: (rise[p], -p))
        share = max(rise[pid], 0.0) / total
    else:
        pid = max(now, key=lambda p: (now[p], -p))
        share = now[pid] / sum(now.values()) if sum(now.values()) > 0 else 0.0
    return Located(pid=pid, role=roles[pid], value=now[pid], usual=usual[pid], share=share, of_rise=total > 0)
