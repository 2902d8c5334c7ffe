"""The agent's py-spy recorders, read from /proc while they run: which CPU went to bursts, and how many bursts.

The agent's CPU with its children comes from `procstat.usage` (exact: the kernel's cutime of reaped recorders).
This splits the children's part by what each recorder was started to do: every `poll_seconds` it lists the
agent's descendants, reads each py-spy's `--rate` and `--pid` from its command line once and its CPU each time,
and books the CPU it used since the last look at that moment. A recorder's last fraction of a poll before it
exits is never seen, the same fraction for a steady and a burst recorder, so the *share* of burst CPU is read
from what was seen and applied to the exact total. A burst recorder is one at a higher rate than the lowest the
agent used for the same target in the run (its steady rate: 3 Hz by default, 1 Hz per member of a family of 4).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.procstat import _descendants

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class _Recorder:
    pid: int
    target: int
    rate: int
    started: float  # the first time it was seen (monotonic)
    cpu_seen: float = 0.0


@dataclass(frozen=True)
class RecorderUse:
    """What the recorders seen in [start, end) did. `burst_share`: of their CPU seen, the part at a burst rate."""

    seconds: float
    recorders: int
    burst_recorders: int
    bursts: int  # runs of consecutive burst recorders on one target, counted on its busiest target
    cpu_seen: float
    burst_cpu_seen: float

    @property
    def burst_share(self) -> float | None:
        return self.burst_cpu_seen / self.cpu_seen if self.cpu_seen > 0 else None

    @property
    def bursts_per_hour(self) -> float | None:
        return self.bursts * 3600.0 / self.seconds if self.seconds > 0 else None


def _pyspy_args(pid: int, proc: Path) -> tuple[int, int] | None:
    """(target pid, rate) of a py-spy recorder, None for any other process (setpriv and prlimit exec py-spy)."""
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    if not argv or not argv[0].endswith(b"py-spy"):
        return None
    try:
        return int(argv[argv.index(b"--pid") + 1]), int(argv[argv.index(b"--rate") + 1])
    except (ValueError, IndexError):
        return None


def _cpu(pid: int, proc: Path) -> float | None:
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


@dataclass
class RecorderLedger:
    """Polls `agent_pid`'s py-spy recorders in a thread from `start()` to `stop()`."""

    agent_pid: int
    poll_seconds: float = 0.5
    proc: Path = Path("/proc")
    clock: Callable[[], float] = time.monotonic
    _recorders: dict[int, _Recorder] = field(default_factory=dict)
    # (time, recorder pid, CPU seconds it used since the previous look)
    _booked: list[tuple[float, int, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> RecorderLedger:
        self._thread = threading.Thread(target=self._run, name="recorder-ledger", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.poll_seconds)

    def poll(self) -> None:
        now = self.clock()
        for pid in _descendants(self.agent_pid, self.proc):
            with self._lock:
                rec = self._recorders.get(pid)
            if rec is None:
                args = _pyspy_args(pid, self.proc)
                if args is None:
                    continue
                rec = _Recorder(pid, args[0], args[1], now)
                with self._lock:
                    self._recorders[pid] = rec
            cpu = _cpu(pid, self.proc)
            if cpu is None or cpu <= rec.cpu_seen:
                continue
            with self._lock:
                self._booked.append((now, pid, cpu - rec.cpu_seen))
                rec.cpu_seen = cpu

    def use(self, start: float, end: float) -> RecorderUse:
        with self._lock:
            recorders = list(self._recorders.values())
            booked = [b for b in self._booked if start <= b[0] < end]
        steady = {}
        for r in recorders:
            steady[r.target] = min(steady.get(r.target, r.rate), r.rate)
        is_burst = {r.pid: r.rate > steady[r.target] for r in recorders}
        inside = sorted((r for r in recorders if start <= r.started < end), key=lambda r: r.started)
        runs: dict[int, int] = {}
        last: dict[int, bool] = {}
        for r in inside:
            if is_burst[r.pid] and not last.get(r.target, False):
                runs[r.target] = runs.get(r.target, 0) + 1
            last[r.target] = is_burst[r.pid]
        return RecorderUse(seconds=end - start, recorders=len(inside),
                           burst_recorders=sum(1 for r in inside if is_burst[r.pid]),
                           bursts=max(runs.values(), default=0),
                           cpu_seen=sum(c for _, _, c in booked),
                           burst_cpu_seen=sum(c for _, pid, c in booked if is_burst.get(pid, False)))
