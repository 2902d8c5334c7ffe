"""Process counters per window: CPU seconds, RSS, threads, fds from psutil; context switches summed over threads and
threads stopped (by a signal, a tracer or a frozen cgroup) or in a disk wait at the read."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from analysis.errors import AccessDenied, ProbeError, TargetGone
from analysis.health import Health
from analysis.window import ProcessReading


@dataclass(frozen=True)
class ThreadStatus:
    """One thread's line of facts from /proc/PID/task/TID/status."""

    voluntary: int
    involuntary: int
    # The kernel's one-letter state at the read: R running, S sleeping, D uninterruptible (disk) sleep, T stopped
    # by a signal, t stopped by a tracer, ...
    state: str


@dataclass(frozen=True)
class _Counters:
    cpu_seconds: float
    # tid -> status: the kernel counts context switches per thread, and /proc/PID/status (what psutil reads) holds
    # the main thread's alone, which in a server is the one that mostly sleeps.
    threads: dict[int, ThreadStatus] = field(default_factory=dict)


def read_threads(pid: int, proc_root: str = "/proc") -> dict[int, ThreadStatus]:
    """Context switches and state of each live thread of `pid`, from /proc/PID/task/TID/status.

    A thread that exits between the listing and its read is left out; the listing itself failing means the
    process is gone (FileNotFoundError, which the source turns into TargetGone)."""
    task = f"{proc_root}/{pid}/task"
    out: dict[int, ThreadStatus] = {}
    for name in os.listdir(task):
        try:
            with open(f"{task}/{name}/status") as f:
                text = f.read()
        except OSError:
            continue  # exited while we listed it
        fields = {}
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches", "State"):
                fields[key] = value.strip()
        try:
            out[int(name)] = ThreadStatus(voluntary=int(fields["voluntary_ctxt_switches"]),
                                          involuntary=int(fields["nonvoluntary_ctxt_switches"]),
                                          state=fields.get("State", "?")[:1] or "?")
        except (KeyError, ValueError):
            continue  # a status file without its counters is no thread we can count
    return out


def cgroup_frozen(pid: int, proc_root: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> bool:
    """Whether `pid`'s cgroup is frozen by the cgroup freezer (what `docker pause` uses), at this instant.

    A frozen thread reads S (sleeping) in its /proc status under cgroup v2, so the thread states alone cannot tell
    a paused server from an idle one. v2: `frozen 1` in the cgroup's cgroup.events, on the unified mount or the
    hybrid one under unified/; v1: FROZEN in the freezer hierarchy's freezer.state. Anything unreadable is not
    frozen: the process may have left, or the host may have no freezer at all.
    """
    try:
        with open(f"{proc_root}/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and path != "/":
            candidates = [(f"{root}{path}/cgroup.events", "frozen 1") for root in (cgroup_root, f"{cgroup_root}/unified")]
        elif "freezer" in controllers.split(",") and path != "/":
            candidates = [(f"{cgroup_root}/freezer{path}/freezer.state", "FROZEN")]
        else:
            continue
        for file, mark in candidates:
            try:
                with open(file) as f:
                    if mark in f.read().splitlines():
                        return True
            except OSError:
                pass
    return False


def thread_switches(pid: int, proc_root: str = "/proc") -> dict[int, tuple[int, int]]:
    """(voluntary, involuntary) context switches of each live thread of `pid` (read_threads)."""
    return switch_counts(read_threads(pid, proc_root))


def switch_counts(threads: dict[int, ThreadStatus]) -> dict[int, tuple[int, int]]:
    return {tid: (t.voluntary, t.involuntary) for tid, t in threads.items()}


def switch_deltas(prev: dict[int, tuple[int, int]], now: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """Switches between two per-thread reads: a thread seen in both adds its difference, a thread new since `prev`
    adds all of its own (it started within the window); the last switches of a thread that exited in between are
    not seen (its counts go with it)."""
    voluntary = involuntary = 0
    for tid, (v, n) in now.items():
        pv, pn = prev.get(tid, (0, 0))
        if v < pv or n < pn:  # a recycled tid: a new thread under an old number
            pv = pn = 0
        voluntary += v - pv
        involuntary += n - pn
    return voluntary, involuntary


class ProcessSource:
    """Reads one process; cpu seconds and context switches are deltas since the previous read.

    The process's start time is pinned at construction: a recycled pid is a different
    process, reported as TargetGone rather than as a negative delta.
    """

    name = "process"

    def __init__(self, pid: int, process_factory: Callable[[int], psutil.Process] = psutil.Process,
                 frozen: Callable[[int], bool] = cgroup_frozen) -> None:
        if pid <= 0:
            raise ValueError(f"pid must be positive, got {pid!r}")
        self.pid = pid
        self._frozen = frozen
        self._errors = 0
        self._last_error: str | None = None
        with self._translate():
            self._proc = process_factory(pid)
            self._created = self._proc.create_time()
            self._prev = self._counters()

    def read(self) -> ProcessReading:
        with self._translate(), self._proc.oneshot():
            if self._proc.create_time() != self._created:
                raise psutil.NoSuchProcess(self.pid, msg="pid was reused by another process")
            if self._proc.status() == psutil.STATUS_ZOMBIE:
                # psutil still answers for an exited, unreaped process: its figures are all stale.
                raise psutil.ZombieProcess(self.pid, msg="exited (zombie, not yet reaped)")
            now = self._counters()
            voluntary, involuntary = switch_deltas(switch_counts(self._prev.threads), switch_counts(now.threads))
            states = [t.state for t in now.threads.values()]
            # A frozen cgroup holds every thread of the process, whatever letter /proc shows for each.
            stopped = len(states) if self._frozen(self.pid) else sum(s in ("T", "t") for s in states)
            reading = ProcessReading(
                cpu_seconds=max(0.0, now.cpu_seconds - self._prev.cpu_seconds),
                rss_bytes=self._proc.memory_info().rss,
                threads=self._proc.num_threads(),
                voluntary_ctx_switches=voluntary,
                involuntary_ctx_switches=involuntary,
                fds=self._proc.num_fds(),
                # At this instant, not over the window: a wait still going on, seen without BPF (the off-CPU
                # probe sees it too, cut at the window's boundary, but it needs root and a BPF-capable kernel).
                stopped_threads=stopped,
                disk_wait_threads=states.count("D"),
            )
        self._prev = now
        self._last_error = None
        return reading

    def close(self) -> None:
        """Nothing to release: psutil keeps no handle open between reads."""

    def health(self) -> Health:
        return Health(name=self.name, state="failed" if self._last_error else "running", reason=self._last_error,
                            error_count=self._errors, detail={"pid": self.pid})

    def _counters(self) -> _Counters:
        cpu = self._proc.cpu_times()
        return _Counters(cpu_seconds=cpu.user + cpu.system, threads=read_threads(self.pid))

    @contextmanager
    def _translate(self) -> Iterator[None]:
        """Turn psutil's and the OS's errors into TargetGone / AccessDenied, counting each."""
        error: ProbeError
        try:
            yield
        except (psutil.NoSuchProcess, ProcessLookupError, FileNotFoundError) as exc:
            # ZombieProcess is a NoSuchProcess: an exited, unreaped target is gone too.
            error = TargetGone(f"target pid {self.pid} is gone: {exc}")
            cause: Exception = exc
        except (psutil.AccessDenied, PermissionError) as exc:
            error = AccessDenied(f"may not read pid {self.pid}: {exc}")
            cause = exc
        else:
            return
        self._errors += 1
        self._last_error = str(error)
        raise error from cause
