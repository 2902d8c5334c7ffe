"""Lifecycle shared by probes that count per target in kernel array slots (tgid -> slot, probes/target_filter.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from analysis.errors import ProbeUnavailable
from analysis.health import Health
from probes.base import TargetSlots, load_bpf, recursion_misses, require_tracepoints
from probes.target_filter import TargetTable


class SlottedProbe(ABC):
    """start/set_targets/read/stop for a BPF program that filters with target_slot() (tgid -> slot,
    probes/target_filter.py) and counts into per-slot arrays, with a per-CPU `lost` counter at index 0.

    Targets come and go without a reload: a new target's slot starts from a baseline of whatever
    the slot holds at that moment (its previous owner's counts), taken before the tgid is written
    into `targets`, so the first reading of the new owner starts at zero.
    """

    name: str
    tracepoints: tuple[str, ...]

    def __init__(self, config: Any, proc_root: Path) -> None:
        self.config = config
        self._proc_root = proc_root
        self._bpf: Any = None
        self._table: TargetTable | None = None
        self._slots = TargetSlots(config.max_targets)
        self._health = Health(name=self.name)

    @abstractmethod
    def _render(self) -> str:
        """The BPF C text for self.config."""

    @abstractmethod
    def _take_baseline(self, added: list[tuple[int, int]]) -> None:
        """Record the current contents of each new (tgid, slot) as its starting point."""

    @abstractmethod
    def _read_slots(self) -> dict[int, Any]:
        """Readings per target since the previous read (or the baseline), then advance the baseline."""

    def _forget(self, slot: int) -> None:
        """Kernel state of a slot whose target left (beyond the `targets` entry); nothing by default."""

    def start(self, targets: Iterable[int]) -> None:
        if self._bpf is not None:
            raise ProbeUnavailable(f"{self.name} probe is already started; use set_targets() to change targets")
        try:
            require_tracepoints(self.tracepoints)
            self._bpf = load_bpf(self._render())
            self._table = TargetTable(self._bpf)
        except ProbeUnavailable as exc:
            self._health.state, self._health.reason = "failed", str(exc)
            raise
        self._health.state, self._health.reason = "running", None
        self.set_targets(targets)

    def set_targets(self, targets: Iterable[int]) -> None:
        """Targets beyond the slots are left out and named in health().unsupported, so their windows
        say why they have no reading; they get a slot on a later call once one is free."""
        self._require_started()
        wanted = set(targets)
        for tgid in [t for t, _ in self._slots.items() if t not in wanted]:
            self._drop(tgid)
        added: list[tuple[int, int]] = []
        self._health.unsupported = {}
        for tgid in sorted(t for t in wanted if t not in self._slots):
            if len(self._slots) >= self._slots.capacity:
                self._health.unsupported[tgid] = (f"all {self._slots.capacity} target slots of {self.name} "
                                                  f"are in use (max_targets)")
                continue
            added.append((tgid, self._slots.add(tgid)))
        if added:
            self._take_baseline(added)
            for tgid, slot in added:
                self._table.add(tgid, slot)
        self._health.targets = len(self._slots)

    def read(self) -> dict[int, Any]:
        self._require_started()
        for tgid in [t for t, _ in self._slots.items() if not (self._proc_root / str(t)).exists()]:
            self._drop(tgid)
        readings = self._read_slots()
        self._health.lost_events = int(sum(self._bpf[b"lost"][0])) + recursion_misses(self._bpf)
        return readings

    def host(self) -> None:
        return None

    def stop(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        self._table = None
        self._slots = TargetSlots(self.config.max_targets)
        self._health.state, self._health.targets = "stopped", 0

    def health(self) -> Health:
        return self._health.copy()

    def _require_started(self) -> None:
        if self._bpf is None:
            raise ProbeUnavailable(f"{self.name} probe is not started")

    def _drop(self, tgid: int) -> None:
        self._table.remove(tgid)
        self._forget(self._slots.remove(tgid))
        self._health.targets = len(self._slots)
