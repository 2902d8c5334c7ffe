"""Changes to a target: its identity read every window (agent.identity), compared with the last settled one, and a
`change` record stored when they differ (docs/changes.md). A restart with the same identity is no change."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.identity import Gone, Identity, IdentityReader, diff
from agent.store.changes import StoredChange
from agent.targets import Target
from analysis.change_cause import ChangeNote
from analysis.window import Window

log = logging.getLogger("infersight.changes")
PROC = Path("/proc")


class ChangeStore(Protocol):
    def settle_identity(self, target: str, pid: int, start_time: int, since: float, identity: dict,
                        change: StoredChange | None) -> None: ...
    def target_identity(self, target: str) -> tuple[int, int, dict] | None: ...
    def forget_identity(self, target: str) -> None: ...
    def identities_since(self) -> dict[str, float]: ...
    def changes(self, target: str | None = None, *, since: float | None = None, until: float | None = None,
                limit: int = 100) -> list[StoredChange]: ...


@dataclass
class _Process:
    key: tuple[int, int]
    windows: int = 0
    settled: bool = False


def boot_time(proc_root: Path = PROC) -> float:
    """Seconds since the epoch when the host booted (/proc/stat btime): process start times count from it."""
    with open(proc_root / "stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime "):
                return float(line.split()[1])
    raise ValueError(f"no btime line in {proc_root}/stat")


class ChangeTracker:
    """One per agent. `observe(target, window)` after each stored window: reads the target's identity, and once its
    process has settled (served, or `settle_windows` windows old) compares it with the last settled identity."""

    def __init__(self, store: ChangeStore, reader: IdentityReader, settle_windows: int = 3,
                 boot: Callable[[], float] = boot_time, ticks_per_second: float | None = None) -> None:
        if settle_windows < 1:
            raise ValueError(f"settle_windows must be at least 1, got {settle_windows!r}")
        self._store = store
        self._reader = reader
        self._settle = settle_windows
        self._boot = boot
        self._hz = ticks_per_second or float(os.sysconf("SC_CLK_TCK"))
        self._processes: dict[str, _Process] = {}
        self._last: dict[str, Identity] = {}
        self._lock = threading.Lock()
        self._latest: dict[str, float] = dict(store.identities_since())
        self._notes: dict[str, ChangeNote | None] = {}
        self.gone_reads = 0

    def observe(self, target: Target, window: Window) -> StoredChange | None:
        """The change this window revealed, stored; None when there is none (or the process left mid-read)."""
        process = self._processes.get(target.name)
        if process is None or process.key != target.key:
            process = self._processes[target.name] = _Process(key=target.key)
        try:
            identity = self._reader.read(target)
        except Gone as exc:
            # Its next window, or the next process, is read again; nothing half-read is stored.
            self.gone_reads += 1
            log.info("target %s: identity not read: %s", target.name, exc)
            return None
        process.windows += 1
        if not process.settled and not _settled(window, process.windows, self._settle):
            return None
        first = not process.settled
        process.settled = True
        last = self._last_identity(target.name)
        changed = diff(last, identity) if last is not None else []
        if last is not None and not changed and not first:
            if _parts(identity) != _parts(last):
                # More of the same build came into view (a package imported late): kept, so a later version of it is
                # compared, but no change.
                self._store.settle_identity(target.name, target.pid, target.start_time, window.end,
                                            identity.to_dict(), None)
                self._last[target.name] = identity
            return None
        # A new process's change dates from its start (what it measured since was the new build); a change within one
        # process (a model reloaded) from the window that saw it.
        at = self._started_at(target) if first else window.end
        change = None
        if changed and last is not None:
            change = StoredChange(id=f"{target.name}-change-{at:.3f}", target=target.name, at=at, pid=target.pid,
                                  before=last.to_dict(), after=identity.to_dict(),
                                  diff=[{"part": c.part, "before": c.before, "after": c.after} for c in changed],
                                  seen_at=window.end)
        self._store.settle_identity(target.name, target.pid, target.start_time, at, identity.to_dict(), change)
        self._last[target.name] = identity
        if change is not None or last is None:
            with self._lock:
                self._latest[target.name] = at
        if change is not None:
            with self._lock:
                self._notes[target.name] = note(change)
            log.warning("target %s changed: %s", target.name, "; ".join(c.describe() for c in changed))
        elif first and last is not None:
            log.info("target %s restarted with the same identity (pid %d): no change", target.name, target.pid)
        return change

    def forget(self, live: list[Target]) -> None:
        """Drop the per-process caches of processes no longer watched; a named target's settled identity stays (it
        may come back), a per-process one's (`name#pid`) goes."""
        names = {t.name for t in live}
        for name in [n for n in self._processes if n not in names]:
            del self._processes[name]
            if "#" in name:
                # One of several processes a regex matched: its name leaves with it (as its detector state does), or
                # a regex over short-lived processes would grow the store by a row each.
                self._store.forget_identity(name)
                self._last.pop(name, None)
                with self._lock:
                    self._latest.pop(name, None)
                    self._notes.pop(name, None)
        self._reader.forget(k for t in live for k in (t.member_keys + (t.key,)))

    def last_change(self, target: str) -> ChangeNote | None:
        """The target's newest change (from the store after an agent restart), for the `change` cause."""
        with self._lock:
            if target in self._notes:
                return self._notes[target]
        found = self._store.changes(target, limit=1)
        with self._lock:
            return self._notes.setdefault(target, note(found[0]) if found else None)

    def latest(self) -> dict[str, float]:
        with self._lock:
            return dict(self._latest)

    def _last_identity(self, name: str) -> Identity | None:
        if name not in self._last:
            saved = self._store.target_identity(name)
            if saved is None:
                return None
            self._last[name] = Identity.from_dict(saved[2])
        return self._last[name]

    def _started_at(self, target: Target) -> float:
        return self._boot() + target.start_time / self._hz


def _parts(identity: Identity) -> dict:
    return {k: v for k, v in identity.to_dict().items() if k != "unknown"}


def note(change: StoredChange) -> ChangeNote:
    """What the detector's layer needs of a stored change: each changed part as one line."""
    return ChangeNote(id=change.id, at=change.at,
                      diff=tuple(f"{d['part']}: {d['before'][:200]} → {d['after'][:200]}" for d in change.diff),
                      seen_at=change.seen_at)


def _settled(window: Window, windows: int, settle: int) -> bool:
    """A new process counts once it has been watched `settle` windows and serves (its latency endpoint answered, or
    it has none): by then it has loaded its model and imported what it runs."""
    return windows >= settle and (window.latency is not None or "latency" not in window.errors)


class ChangeCollector(Collector):
    """infersight_target_change_timestamp_seconds{target}: when each target's newest change happened."""

    def __init__(self, latest: Callable[[], dict[str, float]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily("infersight_target_change_timestamp_seconds",
                                  "When the target's current identity (executable, command line, allowlisted "
                                  "environment, distributions, model files) began: its last change, else when the "
                                  "agent first recorded it; seconds since the epoch.", labels=["target"])
        for name, at in sorted(self._latest().items()):
            gauge.add_metric([name], at)
        yield gauge
