"""A profile merged from stored windows: the store is handed in, so the page and the CLI share it without I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from analysis.flamegraph.export import KINDS, PROFILE_KINDS
from analysis.flamegraph.profile import DEFAULT_LIMITS, TRUNCATED, Limits, Profile


@dataclass(frozen=True)
class FoldedRead:
    """What a store answers for one target, kind and range: the merged folded stacks and how much it left out."""

    stacks: dict[str, int]
    windows: int
    # Stack occurrences not kept because `max_stacks` distinct stacks were held already, and their samples.
    dropped_stacks: int = 0
    dropped_samples: int = 0
    # Set when the read stopped before the range's start: its stacks hold [read_from, until) only.
    read_from: float | None = None
    cut: str | None = None  # "span" (the newest max_span seconds were read) or "time" (the deadline passed)


class ProfileStore(Protocol):
    def read_profiles(self, target: str, since: float | None, until: float | None, kind: str, *,
                      max_stacks: int | None, max_span: float | None, deadline: float | None) -> FoldedRead: ...


CUT_REASONS = {"span": "the range limit", "time": "the time limit"}


def from_store(store: ProfileStore, target: str, since: float | None, until: float | None,
               kind: str = "active", *, max_span: float | None = None, deadline: float | None = None,
               limits: Limits = DEFAULT_LIMITS) -> Profile:
    """Every window of `target` overlapping [since, until), merged; at most `limits.max_stacks` distinct
    stacks are ever held. With `max_span` only the newest that many seconds are read, and at `deadline`
    (time.monotonic) reading stops: the profile's `start` and `truncation.range_cut` then say so."""
    if kind not in PROFILE_KINDS:
        raise ValueError(f"profile kind must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")
    if since is not None and until is not None and since >= until:
        raise ValueError(f"the range is empty: from {since!r} is not before to {until!r}")
    read = store.read_profiles(target, since=since, until=until, kind=kind, max_stacks=limits.max_stacks,
                               max_span=max_span, deadline=deadline)
    prof = Profile.from_folded_dict(read.stacks, unit=KINDS[kind].unit, limits=limits,
                                    start=read.read_from if read.read_from is not None else since, end=until)
    if read.dropped_samples:
        # Kept in the total, as Profile.add does past its own limit.
        prof.stacks[(TRUNCATED,)] = prof.stacks.get((TRUNCATED,), 0) + read.dropped_samples
        prof.truncation.dropped_stacks += read.dropped_stacks
        prof.truncation.dropped_samples += read.dropped_samples
    if read.cut is not None:
        prof.truncation.range_cut = CUT_REASONS[read.cut]
    return prof
