"""Stopping on a signal without the hang that `event.set()` inside a signal handler can cause."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import FrameType


def set_on_signal(event: threading.Event, before: Callable[[int], None] | None = None
                  ) -> Callable[[int, FrameType | None], None]:
    """A signal handler that sets `event` from a new thread.

    Python runs signal handlers in the main thread between bytecodes. When that thread is inside `event.wait()`
    it can hold the event's internal (non-reentrant) lock at that moment, and `event.set()` in the handler would
    then wait for it forever: `infersight collect` hung on SIGTERM that way in CI. A short-lived thread takes the
    lock once the main thread lets go of it."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if before is not None:
            before(signum)
        threading.Thread(target=event.set, name=f"signal-{signum}", daemon=True).start()

    return handler
