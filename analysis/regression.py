"""The detector's findings as plain records: a latency regression, its ranked causes, the functions that grew."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import msgspec

# Causes the detector ranks from signals (docs/detector.md says what signal each one reads), and the ones the agent
# states as facts: `down`, the target's process ended or stopped answering (docs/detector.md, "When the server is down");
# `change`, the regression began just after what the target runs changed (docs/changes.md).
DETECTOR_CAUSES = ("gc", "lock", "blocked", "syscalls", "network", "cpu_contention", "compute", "memory", "unknown")
AGENT_CAUSES = ("down", "change")
CAUSE_LABELS = (*DETECTOR_CAUSES, *AGENT_CAUSES)
SEVERITIES = ("warning", "critical")


@dataclass(frozen=True)
class Neighbour:
    """A process that ran on the target's CPUs while its threads waited (analysis.culprits), over the regression's
    windows: `seconds` of the target's run-queue wait, `share` of that wait (0..1)."""

    pid: int
    comm: str
    seconds: float
    share: float
    cmdline: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Grower:
    """A process whose resident memory grew while the target's memory stalled (analysis.memory_growers): by
    `grew_bytes` over `seconds`; `member` when it is one of the target's own processes."""

    pid: int
    comm: str
    grew_bytes: int
    seconds: float
    member: bool = False
    cmdline: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Writer:
    """A process that wrote to the disks while the target's I/O stalled (analysis.disk_writers): `written_bytes`
    over `seconds`; `member` when it is one of the target's own processes."""

    pid: int
    comm: str
    written_bytes: int
    seconds: float
    member: bool = False
    cmdline: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class Cause:
    """One candidate explanation, with the evidence a person reads ("GC pause 41 ms/s vs 0.8 ms/s (x51)")."""

    label: str
    score: float
    evidence: str
    value: float | None = None
    baseline: float | None = None
    # For a family target: the process the evidence is in (analysis.members), its pid and role; None otherwise.
    pid: int | None = None
    process: str | None = None
    # For cpu_contention: the neighbours that held the CPU while the target waited, most first; empty otherwise.
    neighbours: tuple[Neighbour, ...] = ()
    # For memory: the processes that grew most while it stalled, most first; empty otherwise.
    growers: tuple[Grower, ...] = ()
    # For blocked with the I/O stall moved: the processes that wrote most while it stalled, most first; else empty.
    writers: tuple[Writer, ...] = ()

    def __post_init__(self) -> None:
        if self.label not in CAUSE_LABELS:
            raise ValueError(f"cause label must be one of {', '.join(CAUSE_LABELS)}, got {self.label!r}")
        if not isinstance(self.neighbours, tuple) or not all(isinstance(n, Neighbour) for n in self.neighbours):
            # Rebuilt from JSON (the detector's saved state): the neighbours come back as plain objects.
            object.__setattr__(self, "neighbours", tuple(n if isinstance(n, Neighbour) else Neighbour(**n)
                                                         for n in self.neighbours))
        if not isinstance(self.growers, tuple) or not all(isinstance(g, Grower) for g in self.growers):
            object.__setattr__(self, "growers", tuple(g if isinstance(g, Grower) else Grower(**g)
                                                      for g in self.growers))
        if not isinstance(self.writers, tuple) or not all(isinstance(w, Writer) for w in self.writers):
            object.__setattr__(self, "writers", tuple(w if isinstance(w, Writer) else Writer(**w)
                                                      for w in self.writers))


@dataclass(frozen=True)
class FunctionShift:
    """A Python function whose share of samples moved between the baseline and the regression."""

    function: str
    baseline_share: float
    current_share: float

    @property
    def delta(self) -> float:
        return self.current_share - self.baseline_share


@dataclass
class Regression:
    """One episode from open to close. `causes` is ranked, best first; it is re-ranked while the episode is open."""

    id: str
    target: str
    pid: int
    opened_at: float
    severity: str
    score: float
    causes: list[Cause] = field(default_factory=list)
    functions: list[FunctionShift] = field(default_factory=list)
    closed_at: float | None = None
    # The baseline the regression is measured against (unix seconds), for the differential flame graph.
    baseline_start: float | None = None
    baseline_end: float | None = None
    # The change to the target (agent.store.changes) the regression followed, when its top cause is `change`.
    change_id: str | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {self.severity!r}")

    @property
    def is_open(self) -> bool:
        return self.closed_at is None

    @property
    def top_cause(self) -> str:
        return self.causes[0].label if self.causes else "unknown"


def regression_to_dict(r: Regression) -> dict:
    return asdict(r)


def regression_from_dict(data: dict) -> Regression:
    """msgspec.ValidationError (a ValueError) names the field of a stored regression that does not fit."""
    return msgspec.convert(data, Regression)
