"""Competing busy processes pinned to the server's CPUs; they die with the server."""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
BUSY_LOOP = "while True:\n    pass\n"


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGKILL it if the server dies without cleaning up.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class CpuHog:
    """`per_cpu` spinning processes per CPU the server may run on, with the same affinity."""

    def __init__(self, per_cpu: int = 2, cpus: set[int] | None = None, python: str = sys.executable) -> None:
        if per_cpu <= 0:
            raise ValueError(f"per_cpu must be positive, got {per_cpu!r}")
        self.per_cpu = per_cpu
        self.cpus = cpus if cpus is not None else os.sched_getaffinity(0)
        self.python = python
        self.processes: list[subprocess.Popen] = []

    def on(self) -> None:
        if self.processes:
            return
        for _ in range(self.per_cpu * len(self.cpus)):
            proc = subprocess.Popen([self.python, "-c", BUSY_LOOP], preexec_fn=_die_with_parent,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
            os.sched_setaffinity(proc.pid, self.cpus)
            self.processes.append(proc)

    def off(self) -> None:
        for proc in self.processes:
            proc.kill()
        for proc in self.processes:
            proc.wait(timeout=5)
        self.processes.clear()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]
