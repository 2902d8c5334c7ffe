"""Which process of a family a cause lives in: each member's share of the cause's own measure, against its baseline.

The detector ranks causes on the family's totals (analysis.family); a regression of a service made of several
processes must also say where the evidence is ("GC pause in pid 4242 (VLLM::EngineCore)"). Per cause label there is
one measure per member, per second of window. The member named is the one whose measure grew most over its own
baseline (a slow moving average over healthy windows, kept per role so that a member restarted under a new pid keeps
it); with no baseline yet, the one with the most of it. Growth, not level: an engine always uses more CPU than its API
front, so the front's new CPU is the news when the front is where it grew.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from analysis.attribution import Attributor, SignalStats
from analysis.baseline import stats_of
from analysis.cause_signals import BLOCKED_KINDS, read_all
from analysis.features import Features
from analysis.own_syscalls import workload_counts
from analysis.regression import Cause
from analysis.robust import finite, median
from analysis.waits import WAIT_KINDS
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
# Healthy windows of cause signals kept per role (see MemberBaseline.rows), and the roles that keep them: a row is a
# dozen floats, so a target's saved state stays under ~100 KiB whatever its family does.
SIGNAL_ROWS = 60
MAX_SIGNAL_ROLES = 16


def member_features(family: Features, m: MemberReading) -> Features:
    """One member's features: its own readings, over the family's requests and tokens (the service's load is what
    the member's syscalls per request or CPU per token are per). What only the family or the latency source
    measures (threads stuck at the window's end, preemptions, reachability) stays None: not measured per member."""
    dur = family.duration
    tokens = family.tokens_per_second * dur if family.tokens_per_second else None
    calls = None if m.syscalls is None else float(sum(workload_counts(m.syscalls).values()))
    offcpu = (None if m.offcpu_by_kind is None
              else {kind: m.offcpu_by_kind.get(kind, 0.0) / dur for kind in WAIT_KINDS})
    return Features(
        duration=dur, requests=family.requests, request_rate=family.request_rate,
        tokens_per_second=family.tokens_per_second, tokens_per_request=family.tokens_per_request,
        syscalls_per_second=None if calls is None else calls / dur,
        syscalls_per_request=None if calls is None or not family.requests else calls / family.requests,
        offcpu=offcpu,
        gc_pause_per_second=_per_second(m.gc_pause_seconds, dur),
        retransmits_per_second=_per_second(None if m.retransmits is None else float(m.retransmits), dur),
        runqueue_per_second=_per_second(m.runqueue_seconds, dur),
        cpu_per_second=_per_second(m.cpu_seconds, dur),
        cpu_per_token=None if m.cpu_seconds is None or not tokens else m.cpu_seconds / tokens,
        app_wait_threads=m.app_wait_threads,
    )


def member_measures(window: Window, family: Features | None = None) -> dict[str, dict]:
    """str(pid) -> {"role": its role, label: its measure per second or None, "signals": its cause signals (with the
    family's features given)}, one row per member (a JSON object's keys are strings: the rows travel in the
    detector's saved state). Empty for a single-process window."""
    rows: dict[str, dict] = {}
    for m in window.members:
        row: dict = {"role": m.role, **{label: _measure(label, m, window.duration) for label in LABELS}}
        if family is not None:
            row["signals"] = read_all(member_features(family, m))
        rows[str(m.pid)] = row
    return rows


class MemberBaseline:
    """Per role and cause label, one member's usual measure: an exponential moving average over healthy windows of
    the role's mean per process (gunicorn's four workers share a role; each is judged against one worker's usual).
    And per role, the cause signals of its last healthy windows (`rows`), the baseline a member's own signals are
    ranked against (see `signal_stats`)."""

    def __init__(self, high_quantile: float = 0.9) -> None:
        self.usual: dict[str, dict[str, float]] = {}
        self.rows: dict[str, deque[dict[str, float | None]]] = {}
        self.high_quantile = high_quantile

    def learn(self, measures: Mapping[str, Mapping]) -> None:
        by_role: dict[str, dict[str, list[float]]] = {}
        for row in measures.values():
            signals = row.get("signals")
            role = str(row["role"])
            if signals is not None and (role in self.rows or len(self.rows) < MAX_SIGNAL_ROLES):
                self.rows.setdefault(role, deque(maxlen=SIGNAL_ROWS)).append(dict(signals))
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

    def signal_stats(self, role: str) -> dict[str, SignalStats | None]:
        """Per cause signal, the role's healthy windows' median, MAD-sigma and high quantile (as the family's
        Baseline.stats); None for a signal fewer than 3 of them measured."""
        rows = self.rows.get(role, ())
        out: dict[str, SignalStats | None] = {}
        for name in {k for r in rows for k in r}:
            xs = finite(r.get(name) for r in rows)
            out[name] = stats_of(xs, self.high_quantile)
        return out

    def to_dict(self) -> dict:
        return {role: dict(row) for role, row in self.usual.items()}

    def rows_to_dict(self) -> dict:
        return {role: list(rows) for role, rows in self.rows.items()}

    def load(self, data: Mapping[str, Mapping[str, float]], rows: Mapping[str, Sequence[Mapping]] | None = None) -> None:
        self.usual = {str(role): {str(k): float(v) for k, v in row.items() if k in LABELS}
                      for role, row in list(data.items())[:MAX_ROLES]}
        self.rows = {str(role): deque(({str(k): None if v is None else float(v) for k, v in r.items()}
                                       for r in list(rs)[-SIGNAL_ROWS:]), maxlen=SIGNAL_ROWS)
                     for role, rs in list((rows or {}).items())[:MAX_SIGNAL_ROLES]}


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


def rank_in_members(samples: Sequence[Mapping], baseline: MemberBaseline, attributor: Attributor) -> list[Cause]:
    """The causes each member's own signals show against its role's healthy windows, best per label, each naming its
    member. A family's totals dilute a move in one process by the others' steady share: a lock in an engine whose
    futex wait rose x1.5 read x1.03 in the family beside an API process with 33 idle threads parked on futexes."""
    series: dict[int, dict[str, list[float]]] = {}
    roles: dict[int, str] = {}
    for sample in samples:
        for pid, row in (sample.get("members") or {}).items():
            if row.get("signals") is None:
                continue
            roles[int(pid)] = str(row["role"])
            values = series.setdefault(int(pid), {})
            for name, v in row["signals"].items():
                if v is not None:
                    values.setdefault(name, []).append(float(v))
    if len(roles) < 2:
        return []  # a family of one process is the target itself: its totals are its own
    best: dict[str, Cause] = {}
    for pid in sorted(series):
        stats = baseline.signal_stats(roles[pid])
        if not stats:
            continue
        values = {name: median(xs) for name, xs in series[pid].items()}
        for c in attributor.rank(values, stats):
            if c.label == "unknown" or (c.label in best and best[c.label].score >= c.score):
                continue
            best[c.label] = Cause(c.label, c.score, f"{c.evidence}, in pid {pid} ({roles[pid]})", c.value,
                                  c.baseline, pid=pid, process=roles[pid])
    return sorted(best.values(), key=lambda c: (-c.score, c.label))
