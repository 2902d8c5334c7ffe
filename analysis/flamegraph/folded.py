"""Brendan Gregg's folded stacks ('root;child;leaf count'), as flamegraph.pl and difffolded.pl read them."""

from __future__ import annotations

from .profile import DEFAULT_LIMITS, Limits, Profile


class FoldedParseError(ValueError):
    """A line of folded text that is not 'stack count'."""

    def __init__(self, lineno: int, line: str, why: str) -> None:
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"folded line {lineno}: {why}: {shown!r}")
        self.lineno = lineno


def _count(token: str, lineno: int, line: str) -> int:
    # Digits only: int() would also take '+5', '1_000' and non-ASCII digits, which flamegraph.pl does not.
    if not token.isascii() or not token.isdigit():
        raise FoldedParseError(lineno, line, f"count {token!r} is not a non-negative integer")
    return int(token)


def _split_line(line: str, lineno: int, columns: int) -> tuple[str, list[int]]:
    rest = line
    counts: list[int] = []
    for _ in range(columns):
        rest, sep, token = rest.rpartition(" ")
        if not sep or not rest:
            raise FoldedParseError(lineno, line, f"expected 'stack' and {columns} count(s)")
        counts.append(_count(token, lineno, line))
    counts.reverse()
    return rest, counts


def _lines(text: str):
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.rstrip("\r")
        if line.strip():
            yield lineno, line


def parse_folded(text: str, unit: str = "samples", limits: Limits = DEFAULT_LIMITS) -> Profile:
    """Folded text to a Profile; repeated stacks add up, blank lines are skipped."""
    prof = Profile(unit=unit, limits=limits)
    for lineno, line in _lines(text):
        stack, (count,) = _split_line(line, lineno, 1)
        prof.add(stack.split(";"), count)
    return prof


def format_folded(profile: Profile) -> str:
    """One 'stack count' line per stack, sorted (what stackcollapse-*.pl emit and flamegraph.pl expects)."""
    return "".join(f"{';'.join(stack)} {count}\n" for stack, count in profile.sorted_items())


def format_diff_folded(baseline: Profile, current: Profile, normalise: bool = True) -> str:
    """difffolded.pl's output, 'stack before after', which flamegraph.pl draws as a differential graph.

    With normalise (difffolded.pl -n) the baseline is rescaled to the current total, so colour shows
    a change in share rather than a change in sampling time.
    """
    if normalise:
        baseline = baseline.scaled(current.total())
    stacks = sorted(set(baseline.stacks) | set(current.stacks))
    return "".join(f"{';'.join(s)} {baseline.stacks.get(s, 0)} {current.stacks.get(s, 0)}\n" for s in stacks)


def parse_diff_folded(text: str, unit: str = "samples",
                      limits: Limits = DEFAULT_LIMITS) -> tuple[Profile, Profile]:
    """difffolded.pl output back into (baseline, current)."""
    before, after = Profile(unit=unit, limits=limits), Profile(unit=unit, limits=limits)
    for lineno, line in _lines(text):
        stack, (count1, count2) = _split_line(line, lineno, 2)
        frames = stack.split(";")
        before.add(frames, count1)
        after.add(frames, count2)
    return before, after
