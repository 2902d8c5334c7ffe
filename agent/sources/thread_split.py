"""Split one py-spy `--idle --threads` recording into active and idle stacks by each thread's runnable time."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import BinaryIO

from agent.sources.folded import DEFAULT_STACK_LIMITS, StackBudget, StackCuts, StackLimits, apportion, raw_stacks

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")

# Leaf Python frames that mean "blocked, waiting" (py-spy's own idle heuristic, widened). They only decide
# *which* of a thread's stacks were idle; *how many* comes from the kernel's runnable time.
_WAITING = {
    "threading.py": ("wait", "join", "_wait_for_tstate_lock", "acquire"),
    "selectors.py": ("select",),
    "socket.py": ("accept", "readinto", "recv_into", "recv", "_accept"),
    "ssl.py": ("read", "recv_into", "recv"),
    "queue.py": ("get", "put"),
    "subprocess.py": ("wait", "_wait", "_try_wait", "communicate"),
    "wasyncore.py": ("poll", "poll2"),
    "asyncore.py": ("poll", "poll2"),
    "base_events.py": ("_run_once",),
    "connection.py": ("_recv", "_recv_bytes", "poll", "wait"),
}


@dataclass(frozen=True)
class ThreadStacks:
    """One thread's stacks from one recording; the root frame is the thread's name (py-spy's tid dropped)."""

    tid: int | None
    stacks: Counter[str]

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())


def parse_by_thread(source: str | BinaryIO, limits: StackLimits = DEFAULT_STACK_LIMITS,
                    cuts: StackCuts | None = None) -> dict[int | None, ThreadStacks]:
    """py-spy raw output with `--threads` -> per OS thread id; stacks keyed like `parse_folded` keys them.

    Bounded while it reads (`limits`, what they cut counted in `cuts`): a thread may hold at most what one
    parse may, and the distinct stacks of all threads together at most `max_stacks` and `max_bytes`."""
    budget = StackBudget(limits, cuts)
    out: dict[int | None, ThreadStacks] = {}
    for raw_tid, stack, count in raw_stacks(source, limits, budget.cuts):
        # Decimal is the OS thread id; hex is a pthread id (py-spy without the native id): no kernel figure.
        tid = int(raw_tid) if raw_tid is not None and raw_tid.isascii() and raw_tid.isdigit() else None
        entry = out.setdefault(tid, ThreadStacks(tid=tid, stacks=Counter()))
        entry.stacks[budget.admit(stack, count)] += count
    return out


def is_waiting_leaf(stack: str) -> bool:
    """Whether the innermost Python frame is a known blocking call (`Condition.wait (threading.py:327)`)."""
    leaf = stack.rsplit(";", 1)[-1]
    m = _FRAME.match(leaf)
    if not m:
        return False
    func = m["func"].rsplit(".", 1)[-1]
    filename = m["file"].rsplit("/", 1)[-1]
    return func in _WAITING.get(filename, ())


def split_by_busy(threads: dict[int | None, ThreadStacks],
                  busy: dict[int, float]) -> tuple[Counter[str], Counter[str]]:
    """(active, idle) stacks. `busy[tid]` is the thread's runnable share of the recording (0..1): on a CPU
    or waiting in the run queue, the kernel's counterpart of py-spy's own 'running' test.

    A thread's active sample count is its runnable share of its samples; those samples go to its
    non-waiting stacks first (in proportion), the rest are idle. A thread the kernel has no figure for
    (it started or ended mid-recording) is judged by its leaf frames alone.
    """
    active: Counter[str] = Counter()
    idle: Counter[str] = Counter()
    for tid, entry in threads.items():
        working = {s: n for s, n in entry.stacks.items() if not is_waiting_leaf(s)}
        waiting = {s: n for s, n in entry.stacks.items() if s not in working}
        share = busy.get(tid) if tid is not None else None
        if share is None:
            active.update(working)
            idle.update(waiting)
            continue
        quota = round(min(max(share, 0.0), 1.0) * entry.samples)
        from_working = min(quota, sum(working.values()))
        chosen = apportion(working, from_working) if from_working else {}
        active.update(chosen)
        idle.update({s: n - chosen.get(s, 0) for s, n in working.items() if n > chosen.get(s, 0)})
        spill = quota - from_working
        moved = apportion(waiting, spill) if spill > 0 and waiting else {}
        active.update(moved)
        idle.update({s: n - moved.get(s, 0) for s, n in waiting.items() if n > moved.get(s, 0)})
    return active, idle
