"""Which processes on the host grew in memory: named when the target's memory stalls (issue 34's `memory` cause).

Resident memory of every process is read from /proc/PID/stat (one small read each; cost in docs/BENCHMARKS.md
"Pressure source"). Reference scans are kept, renewed every `reference_seconds`; a window with memory pressure
compares a fresh scan with the older one, so a grower is named by what it took over the last one to two minutes,
whichever process it is: a neighbour, or one of the target's own members (a new build that holds more memory). Processes are keyed by (pid, start time): a pid reused since the reference is a new
process, all of whose memory is new.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from analysis.window import MemoryGrower
from probes.runq_culprits import proc_stats, user_and_cmdline

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# A process that grew less than this over the reference period is not named: allocator noise, not a cause.
MIN_GROWTH_BYTES = 16 << 20
TOP = 3
Scan = dict[tuple[int, int], tuple[str, int]]  # (pid, start time in ticks) -> (comm, resident bytes)


def scan(proc_root: Path) -> Scan:
    """Every process's comm and resident bytes now; a process that exits during the scan is left out."""
    out: Scan = {}
    for pid, comm, fields in proc_stats(proc_root):
        if len(fields) < 22:
            continue  # not a stat line this kernel writes: skip rather than guess
        # Fields 22 (starttime) and 24 (rss, pages), counted from 1 with pid and comm first.
        out[(pid, int(fields[19]))] = (comm, int(fields[21]) * PAGE_SIZE)
    return out


def growers(now: Scan, before: Scan, members: set[int], seconds: float, proc_root: Path,
            top: int = TOP, min_growth: int = MIN_GROWTH_BYTES) -> list[MemoryGrower]:
    """The `top` processes whose resident memory grew most from `before` to `now` (at least `min_growth`), named
    as /proc shows them; `member` when the process is one of the target's own."""
    grown = []
    for key, (comm, rss) in now.items():
        was = before.get(key, (comm, 0))[1]
        if rss - was >= min_growth:
            grown.append((rss - was, key, comm, rss))
    out = []
    for grew, (pid, _), comm, rss in sorted(grown, reverse=True)[:top]:
        user, cmdline = user_and_cmdline(proc_root / str(pid))
        out.append(MemoryGrower(pid=pid, comm=comm, grew_bytes=grew, rss_bytes=rss, seconds=round(seconds, 3),
                                member=pid in members, user=user, cmdline=cmdline))
    return out


class GrowthTracker:
    """The host's resident memory per process against a reference between one and two `reference_seconds` old:
    two scans are kept, renewed in turn, so a grower that began just before a renewal is still seen whole."""

    def __init__(self, proc_root: Path = Path("/proc"), reference_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._proc = proc_root
        self._every = reference_seconds
        self._clock = clock
        first = (scan(proc_root), clock())
        self._older, self._newer = first, first

    def tick(self) -> None:
        """Renew the newer reference when it is due (call once a window; a scan only every `reference_seconds`)."""
        if self._clock() - self._newer[1] >= self._every:
            self._older, self._newer = self._newer, (scan(self._proc), self._clock())

    def growers(self, members: Iterable[int]) -> list[MemoryGrower]:
        """Who grew since the older reference, most first."""
        reference, at = self._older
        return growers(scan(self._proc), reference, set(members), self._clock() - at, self._proc)
