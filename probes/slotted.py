"""Lifecycle shared by probes that count per target in kernel array slots (tgid -> slot, probes/target_filter.py)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from analysis.errors import ProbeUnavailable
from analysis.health import Health
from probes.base import Followed, TargetSlots, load_bpf, recursion_misses, require_tracepoints
from probes.target_filter import TargetTable

# Slots kept offered to the kernel for children of followed targets (a quarter of the slots at most): how many
# children a family may fork between two reads and still have each counted from its first instruction.
FOLLOW_POOL = 16


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
        # Slots offered to the kernel for followed children (probes/target_filter.py), and the children it placed:
        # child tgid -> parent tgid, until the child is no longer a target.
        self._offered: set[int] = set()
        self._family = Followed()

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

    def set_followed(self, tgids: Iterable[int]) -> None:
        """The targets whose new child processes become targets the moment they are forked (a family's members).
        The kernel gives each child a slot from a small pool offered ahead; the next read() adopts them."""
        self._require_started()
        self._family.tgids = set(tgids)
        self._family.sync(self._bpf[b"follow"])
        self._offer()

    def children(self) -> dict[int, int]:
        """Child tgid -> parent tgid of the followed children among the current targets."""
        return dict(self._family.parents)

    def _offer(self) -> None:
        """Keep FOLLOW_POOL baselined slots in the kernel's queue while any target is followed."""
        if not self._family.tgids:
            return
        want = min(FOLLOW_POOL, self._slots.capacity // 4) - len(self._offered)
        slots = [s for s in (self._slots.reserve() for _ in range(max(0, want))) if s is not None]
        if not slots:
            return
        self._take_baseline([(0, slot) for slot in slots])
        for slot in slots:
            self._table.offer_slot(slot)
            self._offered.add(slot)

    def _adopt(self) -> None:
        """Children the kernel placed since the last read become ordinary targets in the slots it gave them."""
        for child, slot, parent in self._table.newborns():
            if child in self._slots or slot not in self._offered:
                continue  # a pid already a target, or a slot not ours: never two owners of one slot
            self._offered.discard(slot)
            self._slots.adopt(child, slot)
            self._table.adopt(child, slot)
            self._family.parents[child] = parent
        self._table.settle_newborns()
        self._health.detail["followed_children_missed"] = self._table.missed_children()
        self._offer()

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
        self._adopt()
        gone = [t for t, _ in self._slots.items() if not (self._proc_root / str(t)).exists()]
        for tgid in self._family.to_drop(gone):
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
        self._family.parents.pop(tgid, None)
        self._health.targets = len(self._slots)
