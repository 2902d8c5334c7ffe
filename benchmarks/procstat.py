"""Read a process's CPU (with every child it started), memory, fds and threads from /proc."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


class ProcessGone(Exception):
    """The process exited while being read."""


@dataclass(frozen=True)
class Usage:
    """One reading of a process tree: CPU seconds so far (itself, reaped children, live descendants)."""

    own_cpu: float
    reaped_children_cpu: float
    live_children_cpu: float
    rss_bytes: int
    peak_rss_bytes: int
    fds: int
    threads: int
    live_children: int

    @property
    def total_cpu(self) -> float:
        return self.own_cpu + self.reaped_children_cpu + self.live_children_cpu


def _stat(pid: int, proc: Path) -> list[str]:
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(f"pid {pid} is gone") from exc
    # Field 2 (comm) may hold spaces and parentheses: split after its closing one.
    return text.rsplit(")", 1)[1].split()


def _descendants(pid: int, proc: Path) -> list[int]:
    """Live descendants, through /proc/PID/task/*/children (needs CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(proc / str(parent) / "task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = (proc / str(parent) / "task" / tid / "children").read_text().split()
            except OSError:
                continue
            for kid in map(int, kids):
                out.append(kid)
                todo.append(kid)
    return out


def _status(pid: int, proc: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                out[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise ProcessGone(f"pid {pid} is gone") from exc
    return out


def usage(pid: int, proc: Path = Path("/proc")) -> Usage:
    """CPU of `pid` and of everything it started: its own, its reaped children's (cutime + cstime), and
    the live descendants' own (py-spy recorders still running). The sum only grows, whenever a child
    is reaped, so two readings give the tree's CPU in between."""
    fields = _stat(pid, proc)
    own = (int(fields[11]) + int(fields[12])) / _TICK
    reaped = (int(fields[13]) + int(fields[14])) / _TICK
    live = 0.0
    kids = _descendants(pid, proc)
    for kid in kids:
        try:
            kf = _stat(kid, proc)
        except ProcessGone:
            continue  # reaped between listing and reading: its CPU is in `reaped` from now on
        # A live child's own reaped children are not yet in our cutime either.
        live += (int(kf[11]) + int(kf[12]) + int(kf[13]) + int(kf[14])) / _TICK
    status = _status(pid, proc)
    try:
        fds = len(os.listdir(proc / str(pid) / "fd"))
    except OSError as exc:
        raise ProcessGone(f"pid {pid} is gone") from exc
    return Usage(own_cpu=own, reaped_children_cpu=reaped, live_children_cpu=live,
                 rss_bytes=status.get("VmRSS", 0) * 1024, peak_rss_bytes=status.get("VmHWM", 0) * 1024,
                 fds=fds, threads=status.get("Threads", 0), live_children=len(kids))


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float:
    """The process's own CPU seconds (all its threads), children not included."""
    fields = _stat(pid, proc)
    return (int(fields[11]) + int(fields[12])) / _TICK
