"""Threads of the target that slept through a whole step (idle pool threads), and the kernel wait each sleeps in."""

from __future__ import annotations

from pathlib import Path

from agent.sources.process import thread_switches

PROC = Path("/proc")
# /proc/PID/task/TID/stat states of a thread that is neither on a CPU nor runnable.
BLOCKED_STATES = frozenset("SDI")


def switches(pid: int, proc: Path = PROC) -> dict[int, int]:
    """Context switches so far (voluntary + involuntary) of each thread of `pid`; empty when it is gone."""
    try:
        return {tid: v + n for tid, (v, n) in thread_switches(pid, str(proc)).items()}
    except OSError:
        return {}


def idle_since(pid: int, before: dict[int, int], proc: Path = PROC) -> dict[int, str | None]:
    """Threads blocked from the `before` reading until now -> their folded kernel stack (root first), or
    None when it cannot be read (not root).

    No context switch since `before` and blocked now means blocked the whole time: a thread that ran
    in between would have been switched out to block again. One that has run without a switch since
    (alone on its CPU) is not blocked now, so it is left out, as is a thread that woke just now.
    """
    now = switches(pid, proc)
    out: dict[int, str | None] = {}
    for tid, count in now.items():
        if before.get(tid) != count:
            continue
        task = proc / str(pid) / "task" / str(tid)
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        # The state follows the parenthesised comm, which may itself contain ')'.
        if stat[stat.rindex(")") + 2] not in BLOCKED_STATES:
            continue
        out[tid] = _kernel_stack(task / "stack")
    return out


def _kernel_stack(path: Path) -> str | None:
    """'[<0>] futex_wait_queue+0x63/0x90' lines, leaf first -> 'root;...;leaf' like the off-CPU probe's stacks."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    names = [line.split("] ", 1)[-1].split("+", 1)[0].strip() for line in lines]
    return ";".join(reversed([n for n in names if n])) or None
