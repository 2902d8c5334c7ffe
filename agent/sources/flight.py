"""One job run off the collection thread, on its own daemon thread, waited for until a deadline."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from analysis.errors import ProbeError, ReadingError
from analysis.redact import redact_text

log = logging.getLogger("infersight.sources")

T = TypeVar("T")


class Flight(Generic[T]):
    """`job()` on a daemon thread, started now. `wait()` returns whether it ended by `deadline` (monotonic);
    `result()` returns what it returned or raises what it raised (a ProbeError as is; anything else as a
    ReadingError, after logging the traceback: a bug in one target's job must not end the collection loop).
    `abort` is called by `cancel()`, from the waiting thread, to make a job past its deadline end now."""

    def __init__(self, job: Callable[[], T], name: str, deadline: float,
                 abort: Callable[[], None] | None = None) -> None:
        self.started = time.monotonic()
        self.deadline = deadline
        self._job, self._abort = job, abort
        self._done = threading.Event()
        self._value: T | None = None
        self._error: ProbeError | None = None
        self.consumed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._job()
        except ProbeError as exc:
            self._error = exc
        except Exception as exc:  # the top of this thread: logged with its traceback, and shown as the reading's error
            log.exception("%s failed", self._thread.name)
            self._error = ReadingError(f"{self._thread.name} failed: {type(exc).__name__}: {redact_text(str(exc))}")
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> bool:
        """Wait until the job ends or its deadline (monotonic) passes; whether it ended."""
        return self._done.wait(max(0.0, self.deadline - time.monotonic()))

    def result(self) -> T:
        if not self._done.is_set():
            raise RuntimeError("result() of a flight still running")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def cancel(self, join_seconds: float = 0.0) -> None:
        """Make the job end now (its abort), and wait up to `join_seconds` for its thread."""
        if self._abort is not None and not self._done.is_set():
            self._abort()
        if join_seconds > 0:
            self._thread.join(join_seconds)
