"""What steady py-spy recordings longer than a window do to detection, replayed on the recorded scenarios.

The recordings hold stacks in every window (steady recordings of one window). A steady recording of N windows
hands its stacks to the window it ends in and leaves the N - 1 before it without a `stacks` reading; a burst
(a recorded window above the steady rate) cuts the running steady recording short, whose samples then come
with the window before the burst's first, and the next steady recording starts after the burst. This rewrites
each recording that way and replays both through the detector, phase by phase:

    .venv/bin/python -m agent.evaluation.steady_gaps --windows 3 tests/scenarios/recorded*/*.jsonl.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.burst import DEFAULT_MIN_SCORE
from agent.evaluation.detection import Tracker, default_detector_factory, detect
from agent.evaluation.recording import LabelledWindow, read_recording
from analysis.errors import STEADY_RECORDING_RUNNING
from analysis.features import extract
from analysis.scoring import Outcome, RunScore, score_run
from analysis.verdict import Verdict
from analysis.window import StackReading

# A window whose stacks ran above this multiple of the lowest (steady) rate seen is a burst's.
BURST_FACTOR = 1.5


def _add(into: StackReading, r: StackReading) -> None:
    for part, folded in ((into.active, r.active), (into.idle, r.idle)):
        for stack, n in folded.items():
            part[stack] = part.get(stack, 0) + n
    into.samples += r.samples


class SteadySpans:
    """Windows as steady recordings of `span` windows would leave them, one window at a time (the module's
    docstring): `cut` ends the running recording with this window, as the sampler does when told to keep steady
    recordings short; unmarked, the windows between read as stacks missing for another reason (the detector
    before analysis.steady_stacks)."""

    def __init__(self, span: int, marked: bool = True) -> None:
        self.span, self.marked = span, marked
        self.steady_rate: float | None = None
        self.pending: StackReading | None = None
        self.held = 0

    def next(self, item: LabelledWindow, cut: bool = False) -> LabelledWindow:
        s = item.window.stacks
        if s is None or item.window.members:
            return item
        if self.steady_rate is None or s.rate_hz < self.steady_rate:
            self.steady_rate = s.rate_hz
        if self.pending is None:
            self.pending = StackReading(rate_hz=s.rate_hz)
        _add(self.pending, s)
        self.held += 1
        # A burst window (above the steady rate) cuts the running recording short, as the burst trigger does.
        if cut or self.held >= self.span or s.rate_hz > self.steady_rate * BURST_FACTOR:
            stacks, self.pending, self.held = self.pending, None, 0
            stacks.rate_hz = s.rate_hz
            return dataclasses.replace(item, window=dataclasses.replace(item.window, stacks=stacks))
        reason = f"py-spy's steady recording is still running: {STEADY_RECORDING_RUNNING}" if self.marked \
            else "py-spy finished no recording since the last read"
        return dataclasses.replace(item, window=dataclasses.replace(
            item.window, stacks=None, errors={**item.window.errors, "stacks": reason}))


def short_while_alert(verdict: Verdict | None) -> bool:
    """Steady recordings of one window while a regression is open or the score is at the burst trigger's level."""
    return verdict is not None and (verdict.state == "regression"
                                    or (verdict.score is not None and verdict.score >= DEFAULT_MIN_SCORE))


def spanned_as_recorded(windows: Sequence[LabelledWindow]) -> bool:
    """Whether a recording was made with steady recordings longer than a window already: as many of its windows
    wait on a running recording (the sampler's marker) as bring stacks. Spanning those again would merge several
    real recordings into one of several times their ticks (thin_stacks did so before session 23)."""
    running = sum(1 for w in windows if STEADY_RECORDING_RUNNING in (w.window.errors.get("stacks") or ""))
    bringing = sum(1 for w in windows if w.window.stacks is not None and not w.window.members)
    return running > 0 and running >= bringing


def replay_spans(windows: Sequence[LabelledWindow], spans: SteadySpans,
                 short: Callable[[Verdict | None], bool] | None = None,
                 factory: Callable[[], Any] | None = None) -> tuple[list[LabelledWindow], list[Outcome]]:
    """The windows as `spans` leaves them and the detector's outcomes on them; with `short`, each window's
    recording is cut when `short` holds for the verdict on the window before (what the sampler's trigger reads).
    A recording already made with steady recordings of several windows is replayed as recorded
    (`spanned_as_recorded`): spanning it again would merge its real recordings."""
    if spanned_as_recorded(windows):
        spans = SteadySpans(1, marked=spans.marked)
    tracker = Tracker(factory or default_detector_factory())
    out, outcomes = [], []
    for item in windows:
        spread_item = spans.next(item, cut=short is not None and short(tracker.last))
        out.append(spread_item)
        outcomes.append(tracker.feed(spread_item))
    return out, outcomes


def _phases(score: RunScore) -> list[dict[str, Any]]:
    return [{"label": p.label, "detected": p.detected, "cause": p.top_cause, "delay_s": p.delay_seconds}
            for p in score.fault_phases]


def _false(score: RunScore) -> int:
    return sum(e.phase is None for e in score.episodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="+", type=Path)
    parser.add_argument("--windows", type=int, default=3, help="windows one steady recording spans (default 3)")
    parser.add_argument("--unmarked", action="store_true",
                        help="windows between recordings read as missing stacks (the detector before analysis.steady_stacks)")
    parser.add_argument("--short-while-alert", action="store_true",
                        help="steady recordings of one window while a regression is open or the score is high")
    args = parser.parse_args(argv)
    factory = default_detector_factory()
    changed, total = 0, 0
    rows = []
    for path in args.recordings:
        rec = read_recording(path)
        spread_windows, outcomes = replay_spans(rec.windows, SteadySpans(args.windows, marked=not args.unmarked),
                                                short_while_alert if args.short_while_alert else None)
        before = score_run(rec.scenario.name, detect(factory, rec.windows))
        after = score_run(rec.scenario.name, outcomes)
        with_stacks = sum(extract(w.window).app_wait_threads is not None for w in spread_windows)
        same = _phases(before) == _phases(after) and _false(before) == _false(after)
        total += 1
        changed += not same
        rows.append({"recording": str(path), "same": same, "windows": len(rec.windows),
                     "windows_with_stacks_after": with_stacks,
                     "before": {"phases": _phases(before), "false_alarms": _false(before)},
                     "after": {"phases": _phases(after), "false_alarms": _false(after)}})
        print(json.dumps(rows[-1]), flush=True)
    print(f"{total - changed} of {total} recordings scored the same with steady recordings of {args.windows} windows",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
