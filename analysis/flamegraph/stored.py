"""A profile merged from stored windows: the store is handed in, so the page and the CLI share it without I/O here."""

from __future__ import annotations

from typing import Protocol

from analysis.flamegraph.export import KINDS, PROFILE_KINDS
from analysis.flamegraph.profile import Profile


class ProfileStore(Protocol):
    def profiles(self, target: str, since: float | None, until: float | None, kind: str) -> dict[str, int]: ...


def from_store(store: ProfileStore, target: str, since: float | None, until: float | None,
               kind: str = "active") -> Profile:
    """Every window of `target` overlapping [since, until), merged."""
    if kind not in PROFILE_KINDS:
        raise ValueError(f"profile kind must be one of {', '.join(PROFILE_KINDS)}, got {kind!r}")
    if since is not None and until is not None and since >= until:
        raise ValueError(f"the range is empty: from {since!r} is not before to {until!r}")
    folded = store.profiles(target, since=since, until=until, kind=kind)
    return Profile.from_folded_dict(folded, unit=KINDS[kind].unit, start=since, end=until)
