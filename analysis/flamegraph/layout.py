"""Flame graph layout: sorted stacks to positioned frames, frames narrower than a minimum width elided."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

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
    # Narrow frames dropped, each with all its callees.
    elided: int
    # Frames with no current samples (only in a diff's baseline): not drawn, not counted as elided.
    absent: int = 0


def layout(items: Sequence[tuple[Stack, int, float]], min_count: float = 0.0,
           max_frames: int = 100_000) -> Layout:
    """Position frames from distinct (stack, count, baseline) triples sorted in tuple order.

    Sorted, every frame's stacks are one contiguous run, so a frame is a slice and its width a
    difference of prefix sums. A run narrower than `min_count` is dropped without visiting its
    callees (they are narrower still), which is what keeps 100,000 distinct stacks cheap; if more
    than `max_frames` remain, only the widest are kept. Both bound the output size.
    """
    cum = [0, *accumulate(count for _, count, _ in items)]
    bcum = [0.0, *accumulate(base for _, _, base in items)]
    total = cum[-1]
    frames: list[Frame] = []
    elided = absent = 0
    if total <= 0:
        return Layout(frames=[], total=0, max_depth=0, elided=0, absent=1 if items else 0)
    root = Frame(ROOT, 0, 0, total, 0, bcum[-1], 0.0)
    frames.append(root)
    work: list[tuple[int, int, Frame]] = [(0, len(items), root)]
    while work:
        lo, hi, parent = work.pop()
        depth = parent.depth
        i = lo
        # Stacks are distinct, so at most one ends at this frame, and it sorts first: the self samples.
        if len(items[i][0]) == depth:
            parent.self_count, parent.base_self = items[i][1], items[i][2]
            i += 1
        while i < hi:
            name = items[i][0][depth]
            j = i + 1
            while j < hi and items[j][0][depth] == name:
                j += 1
            count = cum[j] - cum[i]
            if count <= 0:
                absent += 1
            elif count < min_count:
                elided += 1
            else:
                frame = Frame(name, depth + 1, cum[i], count, 0, bcum[j] - bcum[i], 0.0)
                frames.append(frame)
                work.append((i, j, frame))
            i = j
    if len(frames) > max_frames:
        # A parent is never narrower than its child, and the depth tie-break keeps parents first.
        frames.sort(key=lambda f: (-f.count, f.depth))
        elided += len(frames) - max_frames
        del frames[max_frames:]
    frames.sort(key=lambda f: (f.depth, f.start))
    max_depth = max((f.depth for f in frames), default=0)
    return Layout(frames=frames, total=total, max_depth=max_depth, elided=elided, absent=absent)
