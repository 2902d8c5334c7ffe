"""Profile: root-first stacks to sample counts, bounded against untrusted frame names."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

TRUNCATED = "[truncated]"
UNKNOWN = "[unknown]"

Stack = tuple[str, ...]


@dataclass(frozen=True)
class Limits:
    """Bounds that keep a hostile target from blowing up memory or output size."""

    max_frame_len: int = 512
    max_depth: int = 512
    max_frames: int = 65_536
    max_stacks: int = 262_144

    def __post_init__(self) -> None:
        for name in ("max_frame_len", "max_depth", "max_frames", "max_stacks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 2:
                raise ValueError(f"Limits.{name} must be an int >= 2, got {value!r}")


DEFAULT_LIMITS = Limits()


@dataclass
class Truncation:
    """How much of the input the limits changed; shown beside every rendering."""

    long_frames: int = 0
    deep_stacks: int = 0
    dropped_frames: int = 0
    dropped_stacks: int = 0
    dropped_samples: int = 0
    # Why only the newest part of the asked range was read (a bounded reader stopped); the profile's start says
    # from where.
    range_cut: str | None = None

    def any(self) -> bool:
        return bool(self.long_frames or self.deep_stacks or self.dropped_frames or self.dropped_stacks
                    or self.range_cut)

    def add(self, other: Truncation) -> None:
        self.long_frames += other.long_frames
        self.deep_stacks += other.deep_stacks
        self.dropped_frames += other.dropped_frames
        self.dropped_stacks += other.dropped_stacks
        self.dropped_samples += other.dropped_samples
        self.range_cut = self.range_cut or other.range_cut


# ';' and line breaks cannot travel in folded text (C1 controls and U+2028/9 break lines for
# readers using Unicode line rules, e.g. Python's splitlines); surrogates and U+FFFE/F are not legal XML 1.0;
# bidi controls (U+061C, 200E/F, 202A-E, 2066-9) reorder the text a name is shown in, so a target could make
# a frame, or the counts beside it, read as something else.
_UNSAFE = re.compile(r"[;\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


# flamegraph.pl reads a trailing " <number>" before the count as a differential column.
_NUMERIC_TAIL = re.compile(r" (?=\d+(?:\.\d*)?$)")


def _escape_match(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean_frame(name: str, limits: Limits = DEFAULT_LIMITS) -> tuple[str, bool]:
    """One canonical, printable, bounded form of a frame name; True when it had to be shortened."""
    if not isinstance(name, str):
        raise TypeError(f"frame names must be str, got {type(name).__name__}: {name!r}")
    if not name:
        return UNKNOWN, False
    if _UNSAFE.search(name):
        name = _UNSAFE.sub(_escape_match, name)
    if _NUMERIC_TAIL.search(name):
        name = _NUMERIC_TAIL.sub(r"\\x20", name)
    if len(name) > limits.max_frame_len:
        return name[: limits.max_frame_len - 3] + "...", True
    return name, False


@dataclass
class Profile:
    """Samples (or another integer unit) per distinct root-first stack."""

    stacks: dict[Stack, int] = field(default_factory=dict)
    unit: str = "samples"
    start: float | None = None
    end: float | None = None
    limits: Limits = DEFAULT_LIMITS
    truncation: Truncation = field(default_factory=Truncation)
    _frames: set[str] = field(default_factory=set, init=False, repr=False, compare=False)
    _clean: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        raw, self.stacks = self.stacks, {}
        for stack, count in raw.items():
            self.add(stack, count)

    def add(self, stack: Iterable[str], count: int = 1) -> None:
        """Add count samples of one stack; limits apply here, so every exporter sees the same names."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"sample count must be a non-negative int, got {count!r}")
        if isinstance(stack, str):
            raise TypeError(f"a stack is a sequence of frame names, not one string: {stack[:80]!r}; split it on ';'")
        if count == 0:
            return
        key = self._bounded(tuple(stack))
        if key not in self.stacks and len(self.stacks) >= self.limits.max_stacks:
            self.truncation.dropped_stacks += 1
            self.truncation.dropped_samples += count
            key = (TRUNCATED,)
        self.stacks[key] = self.stacks.get(key, 0) + count

    def _bounded(self, stack: Stack) -> Stack:
        if not stack:
            return (UNKNOWN,)
        if len(stack) > self.limits.max_depth:
            self.truncation.deep_stacks += 1
            stack = stack[: self.limits.max_depth - 1] + (TRUNCATED,)
        # Fast path: almost every frame of a real profile has been seen before.
        out = list(map(self._clean.get, stack))
        if None in out:
            for i, name in enumerate(out):
                if name is None:
                    out[i] = self._admit(stack[i])
        return tuple(out)

    def _admit(self, raw: str) -> str:
        """Clean a frame name seen for the first time and charge it to the distinct-frame budget."""
        limits, trunc = self.limits, self.truncation
        name, shortened = clean_frame(raw, limits)
        trunc.long_frames += shortened
        if name not in self._frames:
            if len(self._frames) >= limits.max_frames:
                trunc.dropped_frames += 1
                name = TRUNCATED
            self._frames.add(name)
        # Bounded, so a flood of distinct raw names cannot grow it; past the bound names are re-cleaned
        # (and re-counted) on every occurrence.
        if len(self._clean) < 2 * limits.max_frames:
            self._clean[raw] = name
        return name

    @classmethod
    def from_folded_dict(cls, folded: Mapping[str, int], unit: str = "samples", *,
                         start: float | None = None, end: float | None = None,
                         limits: Limits = DEFAULT_LIMITS) -> Profile:
        """From the Window's form: 'root;child;leaf' -> count (py-spy and the off-CPU probe)."""
        prof = cls(unit=unit, start=start, end=end, limits=limits)
        for line, count in folded.items():
            prof.add(line.split(";"), count)
        return prof

    def total(self) -> int:
        return sum(self.stacks.values())

    def frame_count(self) -> int:
        return len(self._frames)

    def items(self) -> Iterator[tuple[Stack, int]]:
        return iter(self.stacks.items())

    def sorted_items(self) -> list[tuple[Stack, int]]:
        """Stacks in tuple order, so siblings with a shared prefix are adjacent (what layout needs)."""
        return sorted(self.stacks.items())

    def merge(self, other: Profile) -> None:
        if other.unit != self.unit:
            raise ValueError(f"cannot merge a profile in {other.unit!r} into one in {self.unit!r}")
        for stack, count in other.stacks.items():
            self.add(stack, count)
        self.truncation.add(other.truncation)
        self.start = _pick(min, self.start, other.start)
        self.end = _pick(max, self.end, other.end)

    def scaled(self, total: int) -> Profile:
        """A copy whose counts are rescaled to sum to about `total` (largest-remainder rounding)."""
        if total < 0:
            raise ValueError(f"target total must be >= 0, got {total!r}")
        mine = self.total()
        out = Profile(unit=self.unit, start=self.start, end=self.end, limits=self.limits)
        if mine == 0 or total == 0:
            return out
        exact = [(stack, count * total / mine) for stack, count in self.stacks.items()]
        floors = {stack: int(value) for stack, value in exact}
        short = total - sum(floors.values())
        by_remainder = sorted(exact, key=lambda sv: sv[1] - int(sv[1]), reverse=True)
        for stack, _ in by_remainder[:short]:
            floors[stack] += 1
        out.stacks = {s: c for s, c in floors.items() if c}
        out._frames = set(self._frames)
        return out

    def fractions(self) -> dict[Stack, float]:
        """Each stack's share of the total: the normalised form two profiles compare in."""
        mine = self.total()
        if mine == 0:
            return {}
        return {stack: count / mine for stack, count in self.stacks.items()}


def _pick(fn, a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return fn(a, b)


def merge(profiles: Iterable[Profile], unit: str | None = None,
          limits: Limits = DEFAULT_LIMITS) -> Profile:
    """One profile over a time range from per-window profiles."""
    profiles = list(profiles)
    out = Profile(unit=unit or (profiles[0].unit if profiles else "samples"), limits=limits)
    for prof in profiles:
        out.merge(prof)
    return out
