"""py-spy raw output parsing."""

from __future__ import annotations

import io
import tracemalloc
from collections.abc import Iterator

import pytest

from agent.sources.folded import (
    DEFAULT_STACK_LIMITS,
    TRUNCATED,
    StackCuts,
    StackLimits,
    apportion,
    parse_folded,
    parse_summary,
)
from agent.sources.thread_split import parse_by_thread


def test_thread_frame_keeps_the_name_only() -> None:
    text = ("thread (7254): busy;run (t.py:3);work (t.py:9) 40\n"
            "thread (7255): busy;run (t.py:3);work (t.py:9) 2\n"
            "thread (0x7F01);idle (t.py:1) 5\n\n")
    assert parse_folded(text) == {"busy;run (t.py:3);work (t.py:9)": 42, "thread 0x7F01;idle (t.py:1)": 5}


def test_a_bad_line_is_counted_and_skipped_not_fatal() -> None:
    # A function may name itself with a line break: py-spy prints it as it is and the line splits in two.
    cuts = StackCuts()
    assert parse_folded("a;b 1\noops\nc;evil\nname (x.py:1) 3\nd 2\n", cuts=cuts) == {
        "a;b": 1, "name (x.py:1)": 3, "d": 2}
    assert cuts.bad_lines == 2
    assert parse_folded("a 1\nb \u00b2\n", cuts=cuts) == {"a": 1}  # '²' is a digit to str.isdigit(), not to int()
    assert cuts.bad_lines == 3


def test_summary() -> None:
    out = "py-spy> Wrote raw flamegraph data to 'x'. Samples: 144 Errors: 3\n"
    assert parse_summary(out) == (144, 3)
    assert parse_summary("nothing") is None


def test_apportion_sums_exactly_and_keeps_proportions() -> None:
    assert apportion({"a": 30, "b": 10}, 4) == {"a": 3, "b": 1}
    assert sum(apportion({"a": 1, "b": 1, "c": 1}, 2).values()) == 2
    assert apportion({"a": 3}, 10) == {"a": 3}


class _Generated(io.RawIOBase):
    """A file that produces py-spy output as it is read: 10^5 long lines without 400 MB of test data in memory."""

    def __init__(self, lines: Iterator[bytes]) -> None:
        self._lines, self._left = lines, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            self._left = next(self._lines, b"")
            if not self._left:
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n], self._left = self._left[:n], self._left[n:]
        return n


@pytest.mark.slow
def test_hostile_frames_are_bounded_as_they_are_parsed_and_memory_stays_bounded() -> None:
    # What a target that names its functions with 1 KB of text (control characters included) and makes a new
    # stack every sample gives py-spy to print: 10^5 distinct stacks, 200 MB of output.
    evil = "\x1b[31m<b>" + "x" * 1000
    lines = (f"thread ({1 + i % 7}): worker;f{i}{evil} (h.py:1);g{i}{evil} (h.py:2) 1\n".encode()
             for i in range(100_000))
    cuts = StackCuts()
    tracemalloc.start()
    try:
        threads = parse_by_thread(io.BufferedReader(_Generated(lines), 1 << 16), cuts=cuts)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    limits = DEFAULT_STACK_LIMITS
    stacks = [s for t in threads.values() for s in t.stacks]
    assert sum(t.samples for t in threads.values()) == 100_000  # every sample kept, the cut ones as [truncated]
    assert len(set(stacks)) <= limits.max_stacks + 1 and sum(map(len, set(stacks))) <= limits.max_bytes + 16
    assert all(len(frame) <= limits.max_frame_len for s in stacks for frame in s.split(";"))
    assert cuts.long_frames == 200_000 and cuts.dropped_stacks > 80_000
    assert sum(t.stacks[TRUNCATED] for t in threads.values()) == cuts.dropped_samples
    assert peak < 3 * limits.max_bytes, f"parsing held {peak >> 20} MiB at its peak"


def test_a_line_longer_than_the_read_bound_keeps_its_first_frames_and_its_count() -> None:
    limits = StackLimits(max_line_bytes=1000, max_depth=600)
    frames = ";".join(f"f{i} (deep.py:{i})" for i in range(600))
    cuts = StackCuts()
    ((stack, count),) = parse_folded(f"thread (9): deep;{frames} 17\n", limits, cuts).items()
    assert count == 17 and cuts.long_lines == 1
    kept = stack.split(";")
    assert kept[0] == "deep" and kept[-1] == TRUNCATED and kept[1] == "f0 (deep.py:0)"
    assert len(stack) <= 1000 and all(f.startswith("f") for f in kept[1:-1])  # no half frame


def test_a_deep_stack_keeps_its_root_side_and_a_long_name_its_start() -> None:
    limits = StackLimits(max_depth=8, max_frame_len=16)
    cuts = StackCuts()
    stacks = parse_folded("t;" + ";".join(f"f{i}" for i in range(20)) + " 3\nt;" + "n" * 40 + " 1\n", limits, cuts)
    assert stacks == {"t;f0;f1;f2;f3;f4;f5;" + TRUNCATED: 3, "t;" + "n" * 13 + "...": 1}
    assert (cuts.deep_stacks, cuts.long_frames) == (1, 1)


def test_distinct_stacks_past_the_bound_are_counted_under_truncated() -> None:
    cuts = StackCuts()
    stacks = parse_folded("".join(f"t;f{i} 2\n" for i in range(10)) + "t;f0 5\n", StackLimits(max_stacks=4), cuts)
    assert stacks == {"t;f0": 7, "t;f1": 2, "t;f2": 2, "t;f3": 2, TRUNCATED: 12}
    assert (cuts.dropped_stacks, cuts.dropped_samples) == (6, 12)


@pytest.mark.parametrize("field", ["max_frame_len", "max_depth", "max_stacks", "max_bytes", "max_line_bytes"])
@pytest.mark.parametrize("bad", [0, 3, -1, 2.5, True, "9"])
def test_limits_quote_a_bad_value(field: str, bad) -> None:
    with pytest.raises(ValueError, match=f"StackLimits.{field} must be an int >= 4, got {bad!r}"):
        StackLimits(**{field: bad})
