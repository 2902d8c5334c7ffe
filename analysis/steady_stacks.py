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

from dataclasses import dataclass

from analysis.errors import STEADY_RECORDING_RUNNING
from analysis.window import Window

# A longer run of windows between recordings than any steady recording spans (60 s at most, 1 s windows) is not
# one recording's gap: something else stopped the sampler.
MAX_CARRIED_WINDOWS = 60


@dataclass
class Carried:
    """What the latest finished steady recording read: the lock signal, its leaf functions, and the window's end."""

    app_wait_threads: float | None
    leaves: dict[str, float] | None
    at: float
    span: int = 1


class SteadyStacks:
    """Remembers the latest window with stacks; answers for the windows after it that wait on a running recording."""

    def __init__(self) -> None:
        self.latest: Carried | None = None
        self.gap = 0
        # Windows the latest recording spanned: those that waited on it, and the one it came with.
        self.span = 1

    def clear(self) -> None:
        self.latest, self.gap = None, 0

    def read(self, window: Window, app_wait_threads: float | None, leaves: dict[str, float] | None) -> Carried | None:
        """The latest recording's reading when `window` waits on a running steady recording, else None (and
        `window`'s own reading, when it has one, becomes the latest)."""
        if window.stacks is not None:
            self.span = min(self.gap + 1, _windows_held(window))
            self.latest, self.gap = Carried(app_wait_threads, leaves, window.end, self.span), 0
            return None
        if STEADY_RECORDING_RUNNING not in window.errors.get("stacks", ""):
            self.clear()
            return None
        self.gap += 1
        if self.gap > MAX_CARRIED_WINDOWS:
            self.clear()
            return None
        return self.latest


def _windows_held(window: Window) -> int:
    """How many windows' worth of ticks the window's stacks hold (at least one): a recording that ended just after a
    window's end made one more window wait on it than it spans."""
    s, seconds = window.stacks, window.end - window.start
    if s is None or s.rate_hz <= 0 or seconds <= 0:
        return 1
    return max(1, round(s.samples / (s.rate_hz * seconds)))
