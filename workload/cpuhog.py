"""Competing busy processes pinned to the server's CPUs; they die with the server.

They are the server's neighbours, not its own work: each is started through a launcher that exits at once, so the
spinner is not a descendant of the server (an agent that watches the server with its children, docs/config.md
"Families", must not count them as the server's processes). It stays in the server's session, so the kernel's
autogroup scheduling puts it in the same group as the server, and the contention is what it was as a child.
"""

import os
import select
import signal
import subprocess
import sys

# The spinner holds a pidfd of the server: when the server ends, for any reason, the pidfd reads ready and the
# spinner exits. It checks first that the pid still names the server it was started for (its start time), closing
# the race where the server died before the pidfd was opened.
HOG_CODE = """
import os, select, sys, threading
server, started = int(sys.argv[1]), sys.argv[2]
try:
    fd = os.pidfd_open(server)
    if open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()[19] != started:
        os._exit(0)
except OSError:
    os._exit(0)

def watch():
    select.select([fd], [], [])
    os._exit(0)

threading.Thread(target=watch, daemon=True).start()
while True:
    pass
"""

# Starts one spinner, says its pid on stdout and exits: the spinner is then a child of the nearest subreaper. The
# spinner holds none of the launcher's pipes, or reading the launcher's output would wait for the spinner's end.
LAUNCH_CODE = """
import subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL, close_fds=True)
print(proc.pid, flush=True)
"""


def _start_time(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


class CpuHog:
    """`per_cpu` spinning processes per CPU the server may run on, with the same affinity."""

    def __init__(self, per_cpu: int = 2, cpus: set[int] | None = None, python: str = sys.executable) -> None:
        if per_cpu <= 0:
            raise ValueError(f"per_cpu must be positive, got {per_cpu!r}")
        self.per_cpu = per_cpu
        self.cpus = cpus if cpus is not None else os.sched_getaffinity(0)
        self.python = python
        # Spinner pid -> a pidfd of it: it is not our child, so it is signalled and awaited through the pidfd.
        self._spinners: dict[int, int] = {}

    def on(self) -> None:
        if self._spinners:
            return
        me = os.getpid()
        for _ in range(self.per_cpu * len(self.cpus)):
            out = subprocess.run([self.python, "-c", LAUNCH_CODE, self.python, "-c", HOG_CODE, str(me),
                                  _start_time(me)], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                 check=True, timeout=30)
            pid = int(out.stdout.split()[0])
            self._spinners[pid] = os.pidfd_open(pid)
            os.sched_setaffinity(pid, self.cpus)

    def off(self) -> None:
        for pidfd in self._spinners.values():
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it ended already
        for pidfd in self._spinners.values():
            select.select([pidfd], [], [], 5)  # ready once the process has exited
            os.close(pidfd)
        self._spinners.clear()

    @property
    def pids(self) -> list[int]:
        return list(self._spinners)
