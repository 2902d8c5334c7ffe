"""Competing busy processes pinned to the server's CPUs; they die with the server."""

import os
import subprocess
import sys

# The child asks the kernel for SIGKILL when its parent dies (PR_SET_PDEATHSIG = 1), then checks
# the parent is still the one that spawned it, closing the race where the server died first.
# Done in the child rather than in a preexec_fn, which is unsafe in a threaded server.
HOG_CODE = """
import ctypes, os, signal, sys
ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
while True:
    pass
"""


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
            proc = subprocess.Popen([self.python, "-c", HOG_CODE, str(os.getpid())],
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
