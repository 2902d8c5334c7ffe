"""Which processes wrote to the disks: named when the target's I/O stalls (issue 34's outside disk contention).

Each process's bytes sent to the storage layer come from `/proc/PID/io` (`write_bytes` less
`cancelled_write_bytes`: pages dirtied and not truncated away before writeback). The kernel counts them where the
page is dirtied, so a writer that leaves its dirty pages to the flusher is named as well as one that fsyncs; the
block layer would charge the former's writeback to a kworker (docs/BENCHMARKS.md, "Who wrote to the disk?").
One small read per process, only in a window whose I/O stalled (and once a minute for a reference), so its cost
does not grow with the writers' I/O rate, unlike a hook on every bio.

A scan keeps every process's total; a window's writers are the deltas against the newest earlier scan (the last
stalled window's, else the reference at most `reference_seconds` old). A process that started after that scan
(its start time, from /proc/PID/stat, read only for the candidates) is new, all of its bytes within the interval:
a reused pid is not charged the difference to its predecessor's total (one whose delta stays under the minimum
is not looked at: a reused pid that wrote less than its predecessor in all can be missed). The agent and its own
samplers are left out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from analysis.window import DiskWriter
from probes.runq_culprits import is_agent_sampler, parse_stat, read_or_none, user_and_cmdline

CLK_TCK = os.sysconf("SC_CLK_TCK")
# A process that wrote less than this over the interval is not named: a log line, not a cause.
MIN_BYTES = 1 << 20
TOP = 3
Scan = dict[int, int]  # pid -> bytes written (write_bytes - cancelled_write_bytes)


def parse_io(text: str) -> int:
    """write_bytes less cancelled_write_bytes of one /proc/PID/io; ValueError where either is missing."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    try:
        return max(0, int(fields["write_bytes"]) - int(fields["cancelled_write_bytes"]))
    except KeyError as exc:
        raise ValueError(f"no {exc.args[0]} in /proc/PID/io") from None


def scan(proc_root: Path) -> Scan:
    """Every readable process's bytes written so far; one that exits or hides its io (another user's process for
    an unprivileged agent) is left out."""
    out: Scan = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "io").read_text()
        except OSError:
            continue
        try:
            out[int(entry.name)] = parse_io(text)
        except ValueError:
            continue
    return out


def boot_seconds() -> float:
    """Seconds since boot on the clock /proc/PID/stat's start time counts on."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def writers(now: Scan, before: Scan, before_boot: float, members: set[int], agent: int, seconds: float,
            proc_root: Path, top: int = TOP, min_bytes: int = MIN_BYTES) -> list[DiskWriter]:
    """The `top` processes that wrote most from `before` to `now` (at least `min_bytes`), named as /proc shows them;
    `member` when the process is one of the target's own. `before_boot`: when `before` was taken, in seconds since
    boot; a process started after it is charged all its bytes, over the `seconds` it ran (from its start time)
    rather than the whole interval."""
    # A process's counters never go down: a total below the earlier one is another process under the same pid.
    deltas = ((total - before.get(pid, 0) if total >= before.get(pid, 0) else total, pid) for pid, total in now.items())
    out: list[DiskWriter] = []
    for delta, pid in sorted(deltas, reverse=True):
        if len(out) >= top or delta < min_bytes:
            break
        base = proc_root / str(pid)
        stat = read_or_none(base / "stat")
        if stat is None:
            continue  # exited since the scan
        comm, fields = parse_stat(stat)
        if pid == agent or is_agent_sampler(comm, fields, agent):
            continue  # the agent's own writes (its store, a recording) are never a cause
        started = int(fields[19]) / CLK_TCK if len(fields) > 19 else None
        own = seconds
        if started is not None and started > before_boot:
            if pid in before:
                delta = now[pid]  # a new process under a reused pid: all of its bytes are new
            # It wrote them in the part of the interval it ran: its rate is not spread over time before it started.
            own = min(seconds, max(0.0, before_boot + seconds - started))
        user, cmdline = user_and_cmdline(base)
        out.append(DiskWriter(pid=pid, comm=comm, written_bytes=delta, seconds=round(own, 3),
                              member=pid in members, user=user, cmdline=cmdline))
    out.sort(key=lambda w: -w.written_bytes)
    return out


class WriteTracker:
    """Bytes written per process against the newest earlier scan: a reference renewed every `reference_seconds`, or
    the scan of the previous stalled window."""

    def __init__(self, proc_root: Path = Path("/proc"), reference_seconds: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, boot: Callable[[], float] = boot_seconds,
                 agent: int | None = None) -> None:
        self._proc = proc_root
        self._every = reference_seconds
        self._clock = clock
        self._boot = boot
        self._agent = os.getpid() if agent is None else agent
        self._last = self._take()

    def _take(self) -> tuple[Scan, float, float]:
        return scan(self._proc), self._clock(), self._boot()

    def tick(self) -> None:
        """Renew the reference when it is due (call once a window; a scan only every `reference_seconds`)."""
        if self._clock() - self._last[1] >= self._every:
            self._last = self._take()

    def writers(self, members: Iterable[int]) -> list[DiskWriter]:
        """Who wrote most since the newest earlier scan, most first; this scan becomes the next one's reference."""
        before, at, at_boot = self._last
        self._last = now = self._take()
        return writers(now[0], before, at_boot, set(members), self._agent, now[1] - at, self._proc)
