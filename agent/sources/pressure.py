"""Pressure stall information (PSI) per window, host-wide and for the target's cgroup, and its major page faults.

The kernel keeps, per resource (cpu, memory, io), the microseconds in which some task (``some``) or every
non-idle task (``full``) stalled on it: /proc/pressure/* for the host, ``<cgroup>/{cpu,memory,io}.pressure``
for a cgroup v2 (the unified mount, or ``unified/`` on a hybrid host). Each read is the delta to the
previous one. Where the kernel has no PSI (CONFIG_PSI off, or booted with ``psi=0``) the files are missing
or refuse reads: the figures are None with the reason, never zero. Cost: a few small reads of procfs and
cgroupfs per window (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.sources.disk_writers import WriteTracker
from agent.sources.memory_growers import GrowthTracker
from analysis.errors import TargetGone
from analysis.health import Health
from analysis.window import PressureReading

RESOURCES = ("cpu", "memory", "io")
NO_PSI = "the kernel has no pressure stall information (/proc/pressure missing: CONFIG_PSI off or booted with psi=0)"

Totals = dict[str, dict[str, int]]  # resource -> {"some": us, "full": us}


def parse_pressure(text: str) -> dict[str, int]:
    """{"some": total us, "full": total us} of one pressure file; ValueError naming a malformed line."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(part.split("=", 1) for part in rest.split() if "=" in part)
        if kind not in ("some", "full") or "total" not in fields:
            raise ValueError(f"not a pressure line: {line!r}")
        out[kind] = int(fields["total"])
    return out


def read_totals(directory: Path, pattern: str) -> Totals:
    """Totals of every resource; OSError or ValueError as the files give them."""
    return {r: parse_pressure((directory / pattern.format(r)).read_text()) for r in RESOURCES}


def unified_path(pid: int, proc_root: Path) -> str:
    """The process's cgroup v2 path (the "0::" line of /proc/PID/cgroup); TargetGone once it has exited."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        raise TargetGone(f"pid {pid} exited") from None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:]
    raise ValueError("no cgroup v2 membership in /proc/PID/cgroup (a cgroup v1-only host)")


def cgroup_dir(path: str, mounts: Iterable[Path]) -> Path:
    """The directory of cgroup v2 `path` under the first mount that has its pressure files."""
    for mount in mounts:
        candidate = mount / path.lstrip("/")
        if (candidate / "cpu.pressure").exists():
            return candidate
    raise FileNotFoundError(f"no cpu.pressure for cgroup {path} under {', '.join(str(m) for m in mounts)}")


def major_faults(pids: Iterable[int], proc_root: Path) -> int:
    """majflt summed over `pids` (/proc/PID/stat field 12); a process that has exited adds nothing."""
    total = 0
    for pid in pids:
        try:
            stat = (proc_root / str(pid) / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(stat[stat.rindex(")") + 2:].split()[9])
    return total


def reclaimed(proc_root: Path) -> int:
    """Pages the host reclaimed so far (pgsteal_* of /proc/vmstat: kswapd, direct, khugepaged)."""
    total = 0
    for line in (proc_root / "vmstat").read_text().splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("pgsteal_"):
            total += int(value)
    return total


def _delta(now: Totals, before: Totals) -> dict[str, dict[str, float]]:
    return {r: {k: max(0, v - before.get(r, {}).get(k, 0)) / 1e6 for k, v in kinds.items()} for r, kinds in now.items()}


def _memory_stalled(reading: PressureReading) -> bool:
    """Whether the window saw a memory stall (the target's cgroup, else the host) or any reclaim: when naming who
    grew is worth a scan of every process."""
    psi = reading.cgroup or reading.host
    return bool((psi and psi.get("memory", {}).get("some", 0.0) > 0) or reading.reclaimed_pages)


# The I/O stall (the target's cgroup, else the host) that makes naming who wrote worth a read of every process's
# io: 1 % of the window, the `io_pressure` signal's floor (analysis/cause_signals.py).
IO_STALL_SHARE = 0.01


def _io_stalled(reading: PressureReading, seconds: float) -> bool:
    psi = reading.cgroup or reading.host
    return bool(psi) and psi.get("io", {}).get("some", 0.0) >= IO_STALL_SHARE * seconds > 0


@dataclass
class _Sample:
    """One read's totals; None where the part could not be read (the reason beside it)."""

    host: Totals | None = None
    cgroup: Totals | None = None
    cgroup_path: str | None = None
    major_faults: int = 0
    reclaimed_pages: int | None = None
    reasons: dict[str, str] = field(default_factory=dict)
    at: float = 0.0  # monotonic seconds of the read


class PressureSource:
    """PSI of the host and of the target's cgroup, the target's major faults and the host's reclaim, per window."""

    name = "pressure"

    def __init__(self, pid: int, pids: Callable[[], Iterable[int]] | None = None, proc_root: Path = Path("/proc"),
                 cgroup_mounts: tuple[Path, ...] = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))) -> None:
        self.pid = pid
        self._pids = pids or (lambda: (pid,))
        self._proc = proc_root
        self._mounts = cgroup_mounts
        self._health = Health(name=self.name, state="running")
        self._last = self._take()  # the baseline, so that the first window already has deltas
        self._growth = GrowthTracker(proc_root)
        self._writes = WriteTracker(proc_root)

    def _take(self) -> _Sample:
        now = _Sample(at=time.monotonic())
        try:
            now.host = read_totals(self._proc / "pressure", "{}")
        except FileNotFoundError:
            now.reasons["host"] = NO_PSI
        except (OSError, ValueError) as exc:
            now.reasons["host"] = f"/proc/pressure unreadable: {exc}"
        try:
            now.cgroup_path = unified_path(self.pid, self._proc)
            now.cgroup = read_totals(cgroup_dir(now.cgroup_path, self._mounts), "{}.pressure")
        except (OSError, ValueError) as exc:
            # EOPNOTSUPP where PSI is compiled in but switched off (psi=0); no file without PSI or cgroup v2.
            now.reasons["cgroup"] = now.reasons.get("host", f"no cgroup pressure: {exc}")
        now.major_faults = major_faults(self._pids(), self._proc)
        try:
            now.reclaimed_pages = reclaimed(self._proc)
        except (OSError, ValueError) as exc:
            now.reasons["reclaimed_pages"] = f"/proc/vmstat unreadable: {exc}"
        return now

    def read(self) -> PressureReading:
        try:
            now = self._take()
        except TargetGone:
            self._health.state, self._health.reason = "stopped", f"pid {self.pid} exited"
            raise
        before, self._last = self._last, now
        out = PressureReading(cgroup_path=now.cgroup_path, reasons=dict(now.reasons))
        if now.host is not None and before.host is not None:
            out.host = _delta(now.host, before.host)
        elif now.host is not None:
            out.reasons["host"] = "no earlier reading to take a delta from"
        if now.cgroup is not None and before.cgroup is not None and now.cgroup_path == before.cgroup_path:
            out.cgroup = _delta(now.cgroup, before.cgroup)
        elif now.cgroup is not None:
            # Two cgroups' totals do not subtract.
            out.reasons["cgroup"] = (f"the target moved to cgroup {now.cgroup_path} during the window"
                                     if before.cgroup is not None else "no earlier reading to take a delta from")
        # Summed over the current processes: one that left the family takes its count with it, so a drop is a
        # smaller family, not negative faults.
        out.major_faults = max(0, now.major_faults - before.major_faults)
        if now.reclaimed_pages is not None and before.reclaimed_pages is not None:
            out.reclaimed_pages = now.reclaimed_pages - before.reclaimed_pages
        self._growth.tick()
        if _memory_stalled(out):
            out.growers = self._growth.growers(self._pids())
        else:
            out.reasons["growers"] = "not read: no memory stall or reclaim in the window"
        self._writes.tick()
        if _io_stalled(out, now.at - before.at):
            out.writers = self._writes.writers(self._pids())
        elif out.cgroup is None and out.host is None:
            out.reasons["writers"] = "not read: no I/O stall figure to read them by (no PSI)"
        else:
            out.reasons["writers"] = f"not read: I/O stalled under {IO_STALL_SHARE:.0%} of the window"
        return out

    def close(self) -> None:
        self._health.state = "stopped"

    def health(self) -> Health:
        return self._health.copy()
