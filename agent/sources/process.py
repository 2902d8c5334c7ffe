"""Process counters per window from psutil: CPU seconds, RSS, threads, context switches, fds."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from analysis.errors import AccessDenied, ProbeError, TargetGone
from analysis.health import Health
from analysis.window import ProcessReading


@dataclass(frozen=True)
class _Counters:
    cpu_seconds: float
    voluntary: int
    involuntary: int


class ProcessSource:
    """Reads one process; cpu seconds and context switches are deltas since the previous read.

    The process's start time is pinned at construction: a recycled pid is a different
    process, reported as TargetGone rather than as a negative delta.
    """

    name = "process"

    def __init__(self, pid: int, process_factory: Callable[[int], psutil.Process] = psutil.Process) -> None:
        if pid <= 0:
            raise ValueError(f"pid must be positive, got {pid!r}")
        self.pid = pid
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
            reading = ProcessReading(
                cpu_seconds=max(0.0, now.cpu_seconds - self._prev.cpu_seconds),
                rss_bytes=self._proc.memory_info().rss,
                threads=self._proc.num_threads(),
                voluntary_ctx_switches=now.voluntary - self._prev.voluntary,
                involuntary_ctx_switches=now.involuntary - self._prev.involuntary,
                fds=self._proc.num_fds(),
            )
        self._prev = now
        self._last_error = None
        return reading

    def close(self) -> None:
        """Nothing to release: psutil keeps no handle open between reads."""

    def health(self) -> Health:
        return Health(name=self.name, state="failed" if self._last_error else "running", reason=self._last_error,
                            errors=self._errors, detail={"pid": self.pid})

    def _counters(self) -> _Counters:
        cpu = self._proc.cpu_times()
        ctx = self._proc.num_ctx_switches()
        return _Counters(cpu_seconds=cpu.user + cpu.system, voluntary=ctx.voluntary, involuntary=ctx.involuntary)

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
