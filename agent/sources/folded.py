"""Parse py-spy's raw (folded) output and its closing summary line."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

_THREAD_FRAME = re.compile(r"^thread \((?P<tid>[0-9a-fA-Fx]+)\)(?:: (?P<name>.*))?$")
_SUMMARY = re.compile(r"Samples: (?P<samples>\d+) Errors: (?P<errors>\d+)")


def raw_stacks(text: str) -> Iterator[tuple[str | None, str, int]]:
    """'frame;frame;frame COUNT' lines -> (py-spy's thread id text or None, stack, count), one per line.

    py-spy's `--threads` root frame is 'thread (TID): NAME'; the stack keeps the thread's name only:
    keeping the tid would split one worker pool's identical stacks into one entry per OS thread and
    change on every restart.
    """
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stack, sep, count = line.rpartition(" ")
        if not sep or not count.isdigit():
            raise ValueError(f"py-spy raw line {lineno} is not 'stack count': {line!r}")
        frames = stack.split(";")
        tid = None
        if m := _THREAD_FRAME.match(frames[0]):
            tid = m["tid"]
            frames[0] = m["name"] or f"thread {tid}"
        yield tid, ";".join(frames), int(count)


def parse_folded(text: str) -> Counter[str]:
    """Raw py-spy output -> stack -> samples, threads keyed by name (see `raw_stacks`)."""
    stacks: Counter[str] = Counter()
    for _, stack, count in raw_stacks(text):
        stacks[stack] += count
    return stacks


def parse_summary(stdout: str) -> tuple[int, int] | None:
    """(samples, errors) from py-spy record's closing line, or None when it never wrote one."""
    m = _SUMMARY.search(stdout)
    return (int(m["samples"]), int(m["errors"])) if m else None


def apportion(weights: dict[str, int], total: int) -> dict[str, int]:
    """Split `total` over keys in proportion to `weights` (largest remainder, sums exactly)."""
    whole = sum(weights.values())
    if total >= whole:
        return dict(weights)
    exact = {k: w * total / whole for k, w in weights.items()}
    out = {k: int(v) for k, v in exact.items()}
    left = total - sum(out.values())
    for k in sorted(exact, key=lambda k: exact[k] - out[k], reverse=True)[:left]:
        out[k] += 1
    return {k: v for k, v in out.items() if v > 0}
