"""Parse py-spy's raw (folded) output and split samples into active and idle stacks."""

from __future__ import annotations

import re
from collections import Counter

_THREAD_FRAME = re.compile(r"^thread \((?P<tid>[0-9a-fA-Fx]+)\)(?:: (?P<name>.*))?$")
_SUMMARY = re.compile(r"Samples: (?P<samples>\d+) Errors: (?P<errors>\d+)")


def parse_folded(text: str) -> Counter[str]:
    """'frame;frame;frame COUNT' lines -> Counter; the thread frame keeps the thread's name only.

    py-spy's `--threads` root frame is 'thread (TID): NAME'; keeping the tid would split one
    worker pool's identical stacks into one entry per OS thread and change on every restart.
    """
    stacks: Counter[str] = Counter()
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit():
            raise ValueError(f"py-spy raw line {lineno} is not 'stack count': {line!r}")
        frames = stack.split(";")
        if m := _THREAD_FRAME.match(frames[0]):
            frames[0] = m["name"] or f"thread {m['tid']}"
        stacks[";".join(frames)] += int(count)
    return stacks


def parse_summary(stdout: str) -> tuple[int, int] | None:
    """(samples, errors) from py-spy record's closing line, or None when it never wrote one."""
    m = _SUMMARY.search(stdout)
    return (int(m["samples"]), int(m["errors"])) if m else None


def split_idle(active: Counter[str], everything: Counter[str], active_errors: int = 0) -> Counter[str]:
    """Idle stacks = (all threads' samples) - (active threads' samples), per stack.

    Both recorders run the same number of ticks over the same interval, so a thread that
    was on CPU at every tick cancels exactly. A stack never seen active is idle in full;
    for one seen active, ticks the active recorder failed to read (`active_errors`) could
    otherwise show up as spurious idle samples, so they are taken off first.
    """
    idle: Counter[str] = Counter()
    for stack, n in everything.items():
        seen_active = active.get(stack, 0)
        rest = n - seen_active - (active_errors if seen_active else 0)
        if rest > 0:
            idle[stack] = rest
    return idle
