"""The stack-based signals of windows between two steady py-spy recordings that span several windows.

A steady recording longer than a window hands all its stacks to the window it ends in; the windows before that
end have no `stacks` reading, their reason ending in STEADY_RECORDING_RUNNING (analysis.errors). Read as "no
stacks", those windows drop the lock signal (threads waiting in their own code) and the profile shift from every verdict
but one in three, and a lock fault went unseen in a replay of steady recordings of three windows
(docs/BENCHMARKS.md). Between two recordings, the detector reads those signals from the latest finished one
instead, marked with the end of the window it came with: a measurement of the last recording's seconds, never
an invented zero, and never learned into the baseline a second time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from analysis.errors import STEADY_RECORDING_RUNNING
from analysis.window import Window

# A longer run of windows between recordings than any steady recording spans (60 s at most, 1 s windows) is not
# one recording's gap: something else stopped the sampler.
MAX_CARRIED_WINDOWS = 60


@dataclass
class Carried:
    """What the latest finished steady recording read: the lock signal, its leaf functions, and the window's end;
    with the kernel's non-lock off-CPU waits (`blocked`, threads) over the same windows the recording spanned."""

    app_wait_threads: float | None
    leaves: dict[str, float] | None
    at: float
    span: int = 1
    blocked: float | None = None
    # The recording's sampling ticks (the lock signal's denominator: analysis.sampling); None where unknown.
    ticks: float | None = None


class SteadyStacks:
    """Remembers the latest window with stacks; answers for the windows after it that wait on a running recording."""

    def __init__(self) -> None:
        self.latest: Carried | None = None
        self.gap = 0
        # Windows the latest recording spanned: those that waited on it, and the one it came with.
        self.span = 1
        # The kernel's blocked off-CPU reading of the last windows (None where unmeasured), newest last.
        self.blocked_: deque[float | None] = deque(maxlen=MAX_CARRIED_WINDOWS + 1)
        # The mean of those over the windows the latest recording spanned (None: none measured).
        self.span_blocked: float | None = None

    def clear(self) -> None:
        self.latest, self.gap = None, 0
        self.blocked_.clear()

    def read(self, window: Window, app_wait_threads: float | None, leaves: dict[str, float] | None,
             blocked: float | None = None, ticks: float | None = None) -> Carried | None:
        """The latest recording's reading when `window` waits on a running steady recording, else None (and
        `window`'s own reading, when it has one, becomes the latest). `blocked`: the window's off-CPU seconds per
        second in non-lock waits (analysis.cause_signals._blocked), kept so that a recording is judged against the
        kernel's account of the same windows it spanned (`span_blocked`)."""
        self.blocked_.append(blocked)
        if window.stacks is not None:
            self.span = min(self.gap + 1, _windows_held(window))
            spanned = [b for b in list(self.blocked_)[-self.span:] if b is not None]
            self.span_blocked = sum(spanned) / len(spanned) if spanned else None
            self.latest, self.gap = Carried(app_wait_threads, leaves, window.end, self.span, self.span_blocked,
                                            ticks), 0
            return None
        if STEADY_RECORDING_RUNNING not in window.errors.get("stacks", ""):
            # No recording runs (or a family's members carry their own, of this window): the window is its own span.
            self.clear()
            self.blocked_.append(blocked)
            self.span_blocked = blocked
            return None
        self.gap += 1
        if self.gap > MAX_CARRIED_WINDOWS:
            self.clear()
            return None
        return self.latest


def lock_waits(app_wait_threads: float | None, blocked: float | None, usual_blocked: float | None) -> float | None:
    """Threads waiting in their own code that may be waiting on a lock: py-spy's idle stacks (app_wait_threads) less
    the threads the kernel saw waiting, over the same time, in sleeps, disk I/O, page faults, reclaim or a stop
    beyond the baseline's usual (blocked - usual_blocked, both in threads). A Python stack does not say what an idle
    thread waits on; a thread stalled on a major fault in the middle of its own code reads exactly like one queued on
    a lock. Unchanged where the kernel's waits are unmeasured."""
    if app_wait_threads is None or blocked is None or usual_blocked is None:
        return app_wait_threads
    return max(0.0, app_wait_threads - max(0.0, blocked - usual_blocked))


def ticks_of(window: Window) -> float | None:
    """The sampling ticks a window's stacks hold (as analysis.features reads the lock signal over them); None without
    stacks or for a family's window (its members' signals are summed, their ticks not)."""
    s = window.stacks
    if s is None or window.members:
        return None
    ticks = s.samples or s.rate_hz * window.duration
    return float(ticks) if ticks > 0 else None


def _windows_held(window: Window) -> int:
    """How many windows' worth of ticks the window's stacks hold (at least one): a recording that ended just after a
    window's end made one more window wait on it than it spans."""
    s, seconds = window.stacks, window.end - window.start
    if s is None or s.rate_hz <= 0 or seconds <= 0:
        return 1
    return max(1, round(s.samples / (s.rate_hz * seconds)))
