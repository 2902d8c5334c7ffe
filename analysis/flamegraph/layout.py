"""Flame graph layout: sorted stacks to positioned frames, narrow frames elided (flamegraph.pl's flow)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .profile import Stack

ROOT = "all"


@dataclass(slots=True)
class Frame:
    """One box: `depth` 0 is the synthetic root; `start`/`count` are in samples of the drawn profile."""

    name: str
    depth: int
    start: int
    count: int
    self_count: int = 0
    # Differential graphs only: the normalised baseline, inclusive and self.
    base: float = 0.0
    base_self: float = 0.0


@dataclass
class Layout:
    frames: list[Frame]
    total: int
    max_depth: int
    elided: int
    # Frames with no current samples (only in a diff's baseline): not drawn, not counted as elided.
    absent: int = 0


def layout(items: Iterable[tuple[Stack, int, float]], min_count: float = 0.0,
           max_frames: int = 100_000) -> Layout:
    """Position frames from (stack, count, baseline) triples sorted so equal prefixes are adjacent.

    Frames narrower than `min_count` are dropped (with their children, which are narrower still);
    if more than `max_frames` remain, only the widest are kept. Both bound the output size.
    """
    open_: list[list] = [[ROOT, 0, 0.0, 0, 0.0]]  # name, start x, start base, self, self base
    kept: list[Frame] = []
    elided = 0
    absent = 0
    x = 0
    bx = 0.0
    prev: Stack = ()

    def close(depth: int, entry: list) -> None:
        nonlocal elided, absent
        name, start, bstart, self_count, self_base = entry
        count = x - start
        if count <= 0:
            absent += 1
            return
        if count < min_count:
            elided += 1
            return
        kept.append(Frame(name, depth, start, count, self_count, bx - bstart, self_base))

    for stack, count, base in items:
        common = 0
        limit = min(len(prev), len(stack))
        while common < limit and prev[common] == stack[common]:
            common += 1
        while len(open_) > common + 1:
            close(len(open_) - 1, open_.pop())
        for name in stack[common:]:
            open_.append([name, x, bx, 0, 0.0])
        leaf = open_[-1]
        leaf[3] += count
        leaf[4] += base
        x += count
        bx += base
        prev = stack
    while open_:
        close(len(open_) - 1, open_.pop())
    if len(kept) > max_frames:
        # A parent is never narrower than its child, and the depth tie-break keeps parents first.
        kept.sort(key=lambda f: (-f.count, f.depth))
        elided += len(kept) - max_frames
        del kept[max_frames:]
    kept.sort(key=lambda f: (f.depth, f.start))
    max_depth = max((f.depth for f in kept), default=0)
    return Layout(frames=kept, total=x, max_depth=max_depth, elided=elided, absent=absent)
