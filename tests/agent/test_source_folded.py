"""py-spy raw output parsing."""

from __future__ import annotations

import pytest

from agent.sources.folded import apportion, parse_folded, parse_summary


def test_thread_frame_keeps_the_name_only() -> None:
    text = ("thread (7254): busy;run (t.py:3);work (t.py:9) 40\n"
            "thread (7255): busy;run (t.py:3);work (t.py:9) 2\n"
            "thread (0x7F01);idle (t.py:1) 5\n\n")
    assert parse_folded(text) == {"busy;run (t.py:3);work (t.py:9)": 42, "thread 0x7F01;idle (t.py:1)": 5}


def test_bad_line_quotes_it() -> None:
    with pytest.raises(ValueError, match="line 2.*'oops'"):
        parse_folded("a;b 1\noops\n")


def test_summary() -> None:
    out = "py-spy> Wrote raw flamegraph data to 'x'. Samples: 144 Errors: 3\n"
    assert parse_summary(out) == (144, 3)
    assert parse_summary("nothing") is None


def test_apportion_sums_exactly_and_keeps_proportions() -> None:
    assert apportion({"a": 30, "b": 10}, 4) == {"a": 3, "b": 1}
    assert sum(apportion({"a": 1, "b": 1, "c": 1}, 2).values()) == 2
    assert apportion({"a": 3}, 10) == {"a": 3}
