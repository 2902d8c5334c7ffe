"""Parse py-spy's raw (folded) output and its closing summary line, bounded as it is read."""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import BinaryIO

_THREAD_FRAME = re.compile(r"^thread \((?P<tid>[0-9a-fA-Fx]+)\)(?:: (?P<name>.*))?$")
_SUMMARY = re.compile(r"Samples: (?P<samples>\d+) Errors: (?P<errors>\d+)")

# The marker analysis.flamegraph uses for what its limits cut, so both read alike on a flame graph.
TRUNCATED = "[truncated]"
# Bytes kept from the end of a line too long to read whole: enough for its sample count.
_TAIL_BYTES = 64


@dataclass(frozen=True)
class StackLimits:
    """What one parse of py-spy output, and one reading of the sampler, may hold.

    A target names its functions as it likes (names of kilobytes, control characters, a new stack on every
    sample) and py-spy prints them as they are, so the bounds apply while the output is parsed, before
    anything is kept. The first two match analysis.flamegraph's Limits, which the stored profiles get anyway.
    """

    max_frame_len: int = 512           # characters of one frame name; longer ones end in "..."
    max_depth: int = 512               # frames of one stack; deeper ones end in [truncated]
    max_stacks: int = 20_000           # distinct stacks; samples of new ones past it go to [truncated]
    max_bytes: int = 16 << 20          # characters of those distinct stacks together, same
    max_line_bytes: int = 1 << 20      # bytes of one output line read; frames past them are not read

    def __post_init__(self) -> None:
        for name in ("max_frame_len", "max_depth", "max_stacks", "max_bytes", "max_line_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 4:
                raise ValueError(f"StackLimits.{name} must be an int >= 4, got {value!r}")


DEFAULT_STACK_LIMITS = StackLimits()


@dataclass
class StackCuts:
    """What the limits changed, counted (the sampler's health shows the totals)."""

    long_frames: int = 0      # frame names shortened
    deep_stacks: int = 0      # stacks cut to max_depth frames
    long_lines: int = 0       # lines longer than max_line_bytes: their frames past it were not read
    bad_lines: int = 0        # not 'stack count' (a frame name holding a line break splits its line)
    dropped_stacks: int = 0   # new distinct stacks past max_stacks or max_bytes
    dropped_samples: int = 0  # their samples, kept under [truncated]

    def add(self, other: StackCuts) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)

    def any(self) -> bool:
        return any(asdict(self).values())


class StackBudget:
    """The distinct stacks admitted so far and their size: a new stack past either bound becomes [truncated]."""

    def __init__(self, limits: StackLimits = DEFAULT_STACK_LIMITS, cuts: StackCuts | None = None) -> None:
        self.limits = limits
        self.cuts = cuts if cuts is not None else StackCuts()
        self._seen: set[str] = {TRUNCATED}
        self._chars = 0

    def admit(self, stack: str, count: int) -> str:
        if stack in self._seen:
            return stack
        if len(self._seen) > self.limits.max_stacks or self._chars + len(stack) > self.limits.max_bytes:
            self.cuts.dropped_stacks += 1
            self.cuts.dropped_samples += count
            return TRUNCATED
        self._seen.add(stack)
        self._chars += len(stack)
        return stack


def _lines(source: BinaryIO, cap: int) -> Iterator[tuple[bytes, bytes | None]]:
    """(line, None) for each line of at most `cap` bytes; (its first `cap` bytes, its last bytes) for a longer
    one, whose middle is read and dropped, so no line costs more than `cap` bytes of memory."""
    while line := source.readline(cap + 1):
        if line.endswith(b"\n") or len(line) <= cap:
            yield line.rstrip(b"\r\n"), None
            continue
        tail = line[-_TAIL_BYTES:]
        while not tail.endswith(b"\n") and (more := source.readline(cap)):
            tail = (tail + more)[-_TAIL_BYTES:]
        yield line[:cap], tail.rstrip(b"\r\n")


def _count(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def raw_stacks(source: str | BinaryIO, limits: StackLimits = DEFAULT_STACK_LIMITS,
               cuts: StackCuts | None = None) -> Iterator[tuple[str | None, str, int]]:
    """'frame;frame;frame COUNT' lines -> (py-spy's thread id text or None, stack, count), one per line.

    py-spy's `--threads` root frame is 'thread (TID): NAME'; the stack keeps the thread's name only:
    keeping the tid would split one worker pool's identical stacks into one entry per OS thread and
    change on every restart. Frame names, depth and line length are bounded by `limits` here; a line that
    is not 'stack count' is counted in `cuts.bad_lines` and skipped, not fatal: a function may name itself
    with a line break, which splits its line in two.
    """
    cuts = cuts if cuts is not None else StackCuts()
    stream = io.BytesIO(source.encode()) if isinstance(source, str) else source
    for head, tail in _lines(stream, limits.max_line_bytes):
        if tail is None:
            text = head.decode(errors="replace")
            if not text.strip():
                continue
            stack, sep, number = text.rpartition(" ")
            count = _count(number) if sep else None
            frames = stack.split(";")
        else:
            cuts.long_lines += 1
            count = _count(tail.decode(errors="replace").rpartition(" ")[2])
            # The head ends inside a frame: that frame is dropped with the rest of the line.
            frames = head.decode(errors="replace").split(";")[:-1] + [TRUNCATED]
        if count is None:
            cuts.bad_lines += 1
            continue
        tid = None
        if m := _THREAD_FRAME.match(frames[0]):
            tid = m["tid"]
            frames[0] = m["name"] or f"thread {tid}"
        yield tid, _bounded(frames, limits, cuts), count


def _bounded(frames: list[str], limits: StackLimits, cuts: StackCuts) -> str:
    if len(frames) > limits.max_depth:
        cuts.deep_stacks += 1
        frames = frames[: limits.max_depth - 1] + [TRUNCATED]
    for i, name in enumerate(frames):
        if len(name) > limits.max_frame_len:
            cuts.long_frames += 1
            frames[i] = name[: limits.max_frame_len - 3] + "..."
    return ";".join(frames)


def parse_folded(source: str | BinaryIO, limits: StackLimits = DEFAULT_STACK_LIMITS,
                 cuts: StackCuts | None = None) -> Counter[str]:
    """Raw py-spy output -> stack -> samples, threads keyed by name (see `raw_stacks`), within `limits`."""
    budget = StackBudget(limits, cuts)
    stacks: Counter[str] = Counter()
    for _, stack, count in raw_stacks(source, limits, budget.cuts):
        stacks[budget.admit(stack, count)] += count
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
