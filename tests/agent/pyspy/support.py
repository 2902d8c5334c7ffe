"""What the py-spy tests share: a target with one thread on CPU and one waiting on a lock, and waits."""

from __future__ import annotations

import textwrap
import time

import pytest

TARGET = textwrap.dedent("""
    import sys, threading, time
    lock = threading.Lock()
    lock.acquire()

    def burn_cpu_here():
        x = 0
        while True:
            for i in range(10000):
                x += i * i

    def wait_on_lock_here():
        lock.acquire()

    threading.Thread(target=burn_cpu_here, name="burner", daemon=True).start()
    threading.Thread(target=wait_on_lock_here, name="waiter", daemon=True).start()
    print("ready", flush=True)
    # The main thread blocks for good: a thread that wakes up would contend for the GIL and,
    # on a loaded machine, make the burner genuinely wait off-CPU for it.
    threading.Event().wait()
""")


def wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def samples_with(stacks: dict[str, int], func: str) -> int:
    return sum(n for stack, n in stacks.items() if func in stack)
