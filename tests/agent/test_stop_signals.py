"""set_on_signal: a SIGTERM that lands while the main thread holds the stop event's lock still stops the loop."""

from __future__ import annotations

import os
import signal
import threading

from agent.stop_signals import set_on_signal


def test_the_event_is_set_even_when_the_handler_runs_while_its_lock_is_held() -> None:
    stop = threading.Event()
    handler = set_on_signal(stop)
    # Event.wait() holds this (non-reentrant) lock for a few bytecodes, and a signal handler can run right there.
    # A plain stop.set() here would block on it forever; the handler must return and let the main thread go on.
    with stop._cond:  # noqa: SLF001 - the lock a waiting main thread holds
        handler(signal.SIGTERM, None)
        assert not stop.is_set()
    assert stop.wait(5), "set once the main thread let go of the lock"


def test_a_real_signal_stops_a_main_thread_waiting_on_the_event() -> None:
    stop = threading.Event()
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, set_on_signal(stop, before=seen.append))
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        deadline = 200
        while not stop.wait(0.01) and deadline:  # the main thread keeps entering and leaving wait()
            deadline -= 1
        assert stop.is_set() and seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
