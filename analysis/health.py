"""The health record every collector reports, kernel or user space, with one state vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

# running: measuring (per-target gaps are in `unsupported`); failed: cannot run, `reason` says why;
# unsupported: runs on this host but can measure none of its targets; stopped: not started or stopped;
# absent: the host has nothing for it to read (no GPU): a fact about the host, shown neutrally, never an error.
State = Literal["running", "failed", "unsupported", "stopped", "absent"]
STATES: tuple[str, ...] = ("running", "failed", "unsupported", "stopped", "absent")
# States that are not a fault: the page, `infersight status` and /metrics do not count them as failing.
NOT_FAULTS: tuple[str, ...] = ("running", "stopped", "absent")


@dataclass
class Health:
    name: str
    state: State = "stopped"
    reason: str | None = None
    targets: int = 0
    lost_events: int = 0
    failed_stacks: int = 0
    # Failed reads or restarts since start (a source's own count; the registry adds its failures here). A count,
    # unlike Window.errors (a reason per missing reading) and Snapshot.agent_errors (the agent's own, by part).
    # Its JSON name (to_dict, the API) stays "errors".
    error_count: int = 0
    # Targets this collector cannot measure (e.g. not a Python process for gc): pid -> reason.
    unsupported: dict[int, str] = field(default_factory=dict)
    # Collector-specific counters (restarts, gap seconds, scrapes ...), shown as-is on the status page.
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"health state must be one of {STATES}, got {self.state!r}")

    @property
    def up(self) -> bool:
        return self.state == "running"

    def copy(self) -> Health:
        """Its own dicts, so a reader's copy never changes under it."""
        return replace(self, unsupported=dict(self.unsupported), detail=dict(self.detail))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "reason": self.reason, "targets": self.targets,
                "lost_events": self.lost_events, "failed_stacks": self.failed_stacks, "errors": self.error_count,
                "unsupported": {str(pid): why for pid, why in self.unsupported.items()},
                "detail": dict(self.detail)}
