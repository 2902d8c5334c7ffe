"""The agent's state as readers see it: a frozen Snapshot of totals, latest windows, targets and health."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from analysis.health import Health
from analysis.window import READINGS, Log2Histogram, MemberReading, Window, measured_sum

# Process labels per target on /metrics: a family's roles beyond these are summed under OTHER_PROCESSES, so a
# family that spawns processes with ever new titles cannot grow the series without bound.
MAX_PROCESS_LABELS = 32
OTHER_PROCESSES = "other"


@dataclass
class MemberTotals:
    """Monotonic totals of a family's processes of one role (the `process` label): what each member costs."""

    processes: int = 0  # members of this role in the latest window
    cpu_seconds: float | None = None
    offcpu_seconds: float | None = None
    gc_collections: int | None = None
    gc_pause_seconds: float | None = None
    rss_bytes: int | None = None  # latest window's, summed over the role's members

    def add(self, m: MemberReading) -> None:
        self.cpu_seconds = measured_sum((self.cpu_seconds, m.cpu_seconds))
        self.offcpu_seconds = measured_sum((self.offcpu_seconds, m.offcpu_seconds))
        self.gc_collections = measured_sum((self.gc_collections, m.gc_collections))
        self.gc_pause_seconds = measured_sum((self.gc_pause_seconds, m.gc_pause_seconds))


@dataclass
class TargetTotals:
    """Monotonic totals since the agent started watching a target: what Prometheus counters expose."""

    pid: int = 0
    syscalls: Counter = field(default_factory=Counter)
    offcpu_seconds: float = 0.0
    gc_collections: int = 0
    gc_pause_seconds: float = 0.0
    gc_pause_histogram: Log2Histogram = field(default_factory=lambda: Log2Histogram(unit="us"))
    runqueue_histogram: Log2Histogram = field(default_factory=lambda: Log2Histogram(unit="us"))
    runqueue_seconds: float = 0.0
    tcp_retransmits: int = 0
    cpu_seconds: float = 0.0
    requests: float = 0.0
    windows: int = 0
    # The Window fields that gave at least one reading: a counter of a source that never measured this target
    # (no libpython, `tcp = false`) is not exported at all, never as 0.
    measured: set[str] = field(default_factory=set)
    # A family's processes by role (capped at MAX_PROCESS_LABELS, the rest under "other"); empty otherwise.
    members: dict[str, MemberTotals] = field(default_factory=dict)

    def add(self, w: Window) -> None:
        self.pid = w.pid
        self._add_members(w.members)
        self.windows += 1
        self.measured.update(name for name in READINGS if getattr(w, name) is not None)
        if w.syscalls:
            self.syscalls.update(w.syscalls.counts)
        if w.offcpu:
            self.offcpu_seconds += w.offcpu.seconds
        if w.gc:
            self.gc_collections += w.gc.collections
            self.gc_pause_seconds += w.gc.pause_seconds
            self.gc_pause_histogram.add(w.gc.histogram)
        if w.runqueue:
            self.runqueue_histogram.add(w.runqueue.histogram)
            self.runqueue_seconds += w.runqueue.total_seconds
        if w.tcp:
            self.tcp_retransmits += w.tcp.retransmits
        if w.process:
            self.cpu_seconds += w.process.cpu_seconds
        if w.latency:
            self.requests += w.latency.requests

    def _add_members(self, members: list[MemberReading]) -> None:
        for t in self.members.values():
            t.processes, t.rss_bytes = 0, None
        for m in members:
            role = m.role if m.role in self.members or len(self.members) < MAX_PROCESS_LABELS else OTHER_PROCESSES
            t = self.members.setdefault(role, MemberTotals())
            t.processes += 1
            t.rss_bytes = measured_sum((t.rss_bytes, m.rss_bytes))
            t.add(m)


@dataclass
class TargetStatus:
    name: str
    pid: int | None
    state: str  # watching | waiting (never seen yet) | down (its process ended; `detail` says how)
    since: float
    detail: str = ""
    # A family target: how many processes it has now, and what about them the agent could not do (over
    # max_processes, a member of a user not allowed, one it cannot read); None and () for a single process.
    members: int | None = None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Skipped:
    """What one spec matched but the agent does not watch, and why; shown on the page and in /metrics."""

    matched: int = 0
    not_allowed: int = 0  # owned by a user other than root and allowed_users
    over_limit: int = 0  # beyond max_targets
    max_targets: int | None = None

    def line(self) -> str:
        why = []
        if self.not_allowed:
            why.append(f"{self.not_allowed} owned by users not in allowed_users")
        if self.over_limit:
            why.append(f"{self.over_limit} over max_targets" + (f" ({self.max_targets})" if self.max_targets else ""))
        return f"matched {self.matched} processes; not watched: {', '.join(why)}" if why else ""


@dataclass(frozen=True)
class Snapshot:
    """A consistent copy that metrics, the page and `status` share; readers never see the agent's live objects."""

    started: float
    now: float
    latest: dict[str, Window]
    totals: dict[str, TargetTotals]
    targets: dict[str, TargetStatus]
    health: dict[str, Health]
    # Failures of the agent's own work by part ("store", "loop", "discovery", ...); a collector's are in `health`.
    # Shown as "errors" in /api/status and as infersight_agent_errors_total.
    agent_errors: dict[str, int]
    host_tcp_retransmits: int
    windows_written: int
    late_ticks: int
    dropped_windows: int
    last_tick_seconds: float
    # Spec name -> what its regex matched but the agent does not watch (allowed_users, max_targets).
    skipped: dict[str, Skipped] = field(default_factory=dict)
    # Windows recorded without a reading, by Window field (the source failed or cannot measure that target).
    missing_readings: dict[str, int] = field(default_factory=dict)
    # Targets that are down (their `down` episode is open), with why: their process ended, or it lives and its
    # latency port is closed. `infersight_target_up` is 0 for them.
    down: dict[str, str] = field(default_factory=dict)

    @property
    def uptime_seconds(self) -> float:
        return self.now - self.started


def copy_totals(t: TargetTotals) -> TargetTotals:
    """A copy a reader may keep: every container of its own, the scalar fields shared (they are immutable)."""
    return replace(t, syscalls=Counter(t.syscalls),
                   gc_pause_histogram=replace(t.gc_pause_histogram, counts=list(t.gc_pause_histogram.counts)),
                   runqueue_histogram=replace(t.runqueue_histogram, counts=list(t.runqueue_histogram.counts)),
                   measured=set(t.measured), members={role: replace(m) for role, m in t.members.items()})
