"""Threads that slept through a step: from a fixture /proc tree, and from this process's own threads."""

import os
import threading
import time

import pytest

from agent.loadtest.figures import wait_kind
from agent.loadtest.idle_threads import idle_since, switches


def task(root, pid: int, tid: int, state: str, voluntary: int, involuntary: int = 0, stack: str | None = None):
    d = root / str(pid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{tid} (pt_main) thread) {state} 1 2 3\n")
    (d / "status").write_text(f"Name:\tx\nState:\t{state}\nvoluntary_ctxt_switches:\t{voluntary}\n"
                              f"nonvoluntary_ctxt_switches:\t{involuntary}\n")
    if stack is not None:
        (d / "stack").write_text(stack)


FUTEX = "[<0>] futex_wait_queue+0x63/0x90\n[<0>] futex_wait+0x16c/0x250\n[<0>] do_syscall_64+0x71/0x280\n"


def test_only_threads_blocked_without_a_switch_are_idle(tmp_path):
    task(tmp_path, 7, 7, "S", 10, 2, FUTEX)
    task(tmp_path, 7, 8, "S", 5, 0, FUTEX)
    task(tmp_path, 7, 9, "R", 3, 0)  # ran alone on its CPU with no switch: not off-CPU at all
    task(tmp_path, 7, 10, "S", 4, 0)  # blocked, but no readable stack
    before = switches(7, tmp_path)
    assert before == {7: 12, 8: 5, 9: 3, 10: 4}
    task(tmp_path, 7, 7, "S", 11, 2, FUTEX)  # woke and slept again: it ran in the step
    task(tmp_path, 7, 11, "S", 1, 0, FUTEX)  # started during the step
    idle = idle_since(7, before, tmp_path)
    assert idle == {8: "do_syscall_64;futex_wait;futex_wait_queue", 10: None}
    assert wait_kind(idle[8]) == "lock (futex)"


def test_a_process_that_is_gone_has_no_threads(tmp_path):
    assert switches(99, tmp_path) == {} and idle_since(99, {1: 1}, tmp_path) == {}


@pytest.mark.root
def test_a_real_thread_parked_on_an_event_is_idle_and_waits_in_a_futex(require_root):
    parked = threading.Event()
    sleeper = threading.Thread(target=parked.wait, name="parked")
    sleeper.start()
    try:
        time.sleep(0.2)  # let it reach the futex
        before = switches(os.getpid())
        time.sleep(0.3)
        idle = idle_since(os.getpid(), before)
    finally:
        parked.set()
        sleeper.join()
    assert sleeper.native_id in idle, idle
    assert wait_kind(idle[sleeper.native_id]) == "lock (futex)", idle[sleeper.native_id]
    assert threading.get_native_id() not in idle  # this thread ran to read /proc
