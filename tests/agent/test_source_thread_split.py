"""One py-spy recording split into active and idle stacks by each thread's runnable share."""

from __future__ import annotations

from collections import Counter

import pytest

from agent.sources.folded import StackCuts
from agent.sources.thread_split import ThreadStacks, is_waiting_leaf, parse_by_thread, split_by_busy


def test_parse_keeps_the_tid_apart_and_the_name_in_the_stack() -> None:
    text = ("thread (7254): busy;run (t.py:3);work (t.py:9) 40\n"
            "thread (7255): busy;run (t.py:3);work (t.py:9) 2\n"
            "thread (7256);idle (t.py:1) 5\n"
            "thread (0x7F01): old;idle (t.py:1) 3\n\n")
    threads = parse_by_thread(text)
    assert threads[7254].stacks == {"busy;run (t.py:3);work (t.py:9)": 40}
    assert threads[7255].samples == 2
    assert threads[7256].stacks == {"thread 7256;idle (t.py:1)": 5}
    assert threads[None].stacks == {"old;idle (t.py:1)": 3}  # a pthread id: judged by its leaf later


def test_parse_skips_a_bad_line_and_counts_it() -> None:
    cuts = StackCuts()
    threads = parse_by_thread("thread (1): t;a;b 1\noops\n", cuts=cuts)
    assert threads[1].stacks == {"t;a;b": 1} and cuts.bad_lines == 1


@pytest.mark.parametrize("stack, waiting", [
    ("w;Thread.run (threading.py:971);Condition.wait (threading.py:327)", True),
    ("MainThread;loop (waitress/wasyncore.py:240);poll (waitress/wasyncore.py:167)", True),
    ("w;BaseSelector.select (selectors.py:415)", True),
    ("w;Queue.get (queue.py:154)", True),
    ("scheduler;Engine.step (workload/engine.py:68)", False),
    ("w;wait (mymodule.py:3)", False),  # a 'wait' outside the known files is ordinary code
    ("w;<module> (x.py)", False),
])
def test_waiting_leaf(stack: str, waiting: bool) -> None:
    assert is_waiting_leaf(stack) is waiting


def _threads(**by_tid: dict[str, int]) -> dict[int | None, ThreadStacks]:
    return {int(t[1:]): ThreadStacks(tid=int(t[1:]), stacks=Counter(s)) for t, s in by_tid.items()}


def test_never_runnable_thread_is_idle_in_full_even_off_a_known_wait() -> None:
    # Blocked in a C call (lock.acquire): its leaf is ordinary code, but the kernel says it never ran.
    threads = _threads(t1={"waiter;wait_on_lock_here (t.py:12)": 48})
    active, idle = split_by_busy(threads, {1: 0.0})
    assert active == {} and idle == {"waiter;wait_on_lock_here (t.py:12)": 48}


def test_always_runnable_thread_is_active_in_full() -> None:
    threads = _threads(t1={"busy;work (t.py:6)": 30, "busy;work2 (t.py:9)": 18})
    active, idle = split_by_busy(threads, {1: 1.02})  # a share a little over 1 is clock skew
    assert active == {"busy;work (t.py:6)": 30, "busy;work2 (t.py:9)": 18} and idle == {}


def test_mixed_thread_puts_its_idle_share_on_its_waiting_stack_first() -> None:
    threads = _threads(t1={"s;step (e.py:68)": 30, "s;Condition.wait (threading.py:327)": 20})
    active, idle = split_by_busy(threads, {1: 0.5})
    assert active == {"s;step (e.py:68)": 25}
    assert idle == {"s;Condition.wait (threading.py:327)": 20, "s;step (e.py:68)": 5}
    assert sum(active.values()) + sum(idle.values()) == 50


def test_busy_share_above_working_samples_spills_onto_waiting_stacks() -> None:
    threads = _threads(t1={"s;step (e.py:68)": 10, "s;Condition.wait (threading.py:327)": 40})
    active, idle = split_by_busy(threads, {1: 0.4})
    assert active == {"s;step (e.py:68)": 10, "s;Condition.wait (threading.py:327)": 10}
    assert idle == {"s;Condition.wait (threading.py:327)": 30}


def test_thread_without_kernel_figure_is_judged_by_its_leaf() -> None:
    threads = _threads(t9={"n;step (e.py:68)": 7, "n;Event.wait (threading.py:600)": 3})
    active, idle = split_by_busy(threads, {})
    assert active == {"n;step (e.py:68)": 7} and idle == {"n;Event.wait (threading.py:600)": 3}
