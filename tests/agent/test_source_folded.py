"""py-spy raw output parsing and the per-thread active/idle split."""

from __future__ import annotations

from collections import Counter

import pytest

from agent.sources.folded import parse_folded, parse_summary, split_idle


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


def test_thread_never_active_is_idle_in_full() -> None:
    everything = Counter({"waiter;wait (t.py:8)": 48, "busy;work (t.py:6)": 48})
    active = Counter({"busy;work (t.py:6)": 48})
    assert split_idle(active, everything) == {"waiter;wait (t.py:8)": 48}


def test_busy_thread_with_shifted_line_numbers_leaks_nothing() -> None:
    # The two recorders caught the same always-running thread on different lines.
    everything = Counter({"busy;work (t.py:6)": 30, "busy;work (t.py:7)": 18})
    active = Counter({"busy;work (t.py:6)": 20, "busy;work (t.py:7)": 28})
    assert split_idle(active, everything) == {}


def test_mixed_thread_gets_its_idle_share_on_its_waiting_stack() -> None:
    everything = Counter({"w;compute": 30, "w;queue.get": 18})
    active = Counter({"w;compute": 29})
    assert split_idle(active, everything) == {"w;queue.get": 18, "w;compute": 1}


def test_active_read_errors_do_not_turn_into_idle() -> None:
    everything = Counter({"busy;work": 48})
    active = Counter({"busy;work": 45})
    assert split_idle(active, everything, active_errors=3) == {}
