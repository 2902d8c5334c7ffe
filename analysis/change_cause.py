"""The `change` cause: a regression that began within a few windows after what the target runs changed, and whose
evidence is not an outside cause, is put down to the change; its diff first, then the mechanism measured."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from analysis.regression import Cause, Regression

# Causes from outside the target: a neighbour taking the CPUs, packet loss, the server gone. A change does not
# explain them, whatever its timing. `memory` is outside only when the process that grew most is not the target's
# own: a build that holds more memory stalls the server as a neighbour's allocation does (docs/changes.md).
OUTSIDE_CAUSES = ("cpu_contention", "network", "down")
# How long after a change a regression's opening is still put down to it (docs/changes.md): the new process loads,
# serves, and the detector needs k of m windows; at 5 s windows, one minute.
DEFAULT_ONSET_SECONDS = 60.0


@dataclass(frozen=True)
class ChangeNote:
    """A change as the detector's layer needs it: its id, when it happened, and its diff as lines (most telling
    first: "cmdline: … → …")."""

    id: str
    at: float
    diff: tuple[str, ...]
    # When the agent saw it: the new process settled (served) then. A build that takes minutes to load serves, and
    # can regress, long after its start; the onset is counted from here.
    seen_at: float | None = None


def attribute_change(regression: Regression, change: ChangeNote | None,
                     onset_seconds: float = DEFAULT_ONSET_SECONDS) -> Regression:
    """`regression` with `change` as its first cause when it opened after the change and within `onset_seconds` after
    the agent saw it, and its top measured cause is not an outside one; otherwise as measured (any earlier `change`
    label removed)."""
    measured = [c for c in regression.causes if c.label != "change"]
    applies = (change is not None
               and change.at <= regression.opened_at <= max(change.at, change.seen_at or change.at) + onset_seconds
               and not (measured and _outside(measured[0])))
    if not applies:
        return regression if len(measured) == len(regression.causes) and regression.change_id is None else \
            dataclasses.replace(regression, causes=measured, change_id=None)
    assert change is not None
    mechanism = measured[0] if measured and measured[0].label != "unknown" else None
    shown = "; ".join(change.diff[:3]) + (f" (+{len(change.diff) - 3} more)" if len(change.diff) > 3 else "")
    evidence = (f"began after a change: {shown or 'identity changed'}; "
                + (f"mechanism: {mechanism.label}: {mechanism.evidence}" if mechanism is not None
                   else "no measured signal moved beyond latency itself"))
    top = Cause("change", max((c.score for c in measured), default=0.0) + 1.0, evidence)
    return dataclasses.replace(regression, causes=[top, *measured], change_id=change.id)


def _outside(cause: Cause) -> bool:
    if cause.label == "memory":
        return bool(cause.growers) and not cause.growers[0].member
    if cause.writers:  # a disk stall while a neighbour wrote: not the server's own doing
        return not cause.writers[0].member
    return cause.label in OUTSIDE_CAUSES
