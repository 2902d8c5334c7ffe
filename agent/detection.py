"""Run the latency detector on every window: one per target, baselines kept in the store, findings stored and passed on."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from analysis.change_cause import DEFAULT_ONSET_SECONDS, ChangeNote, attribute_change
from analysis.regression import Cause, Regression
from analysis.verdict import Detector, Verdict
from analysis.window import Window

log = logging.getLogger("infersight.detection")


class RegressionListener(Protocol):
    """Told about every episode's life (the alert outbox is one)."""

    def regression_opened(self, regression: Regression) -> None: ...
    def regression_updated(self, regression: Regression) -> None: ...
    def regression_closed(self, regression: Regression) -> None: ...


class FindingsStore(Protocol):
    def detector_state(self, target: str) -> tuple[str, dict] | None: ...
    def save_detector_state(self, target: str, identity: str, state: dict) -> None: ...
    def delete_detector_state(self, target: str) -> None: ...
    def save_regression(self, regression: Regression) -> None: ...
    def take_baseline_resets(self) -> list[str]: ...
    def regressions(self, target: str | None = None, *, open_only: bool = False, since: float | None = None,
                    limit: int = 100) -> list[Regression]: ...


@dataclass(frozen=True)
class TargetFinding:
    """The detector's latest word on one target, for /metrics, the page and `status`."""

    target: str
    state: str  # warmup | healthy | regression | down
    score: float | None
    expected: dict[str, float]
    regression: Regression | None
    window_end: float
    armed: bool = True  # the baseline is learned (also while the target is down)


@dataclass
class _Tracked:
    detector: Detector
    identity: str
    unsaved: int = 0


@dataclass(frozen=True)
class DetectionSnapshot:
    findings: dict[str, TargetFinding] = field(default_factory=dict)
    # (target, top cause at opening) -> episodes opened since the agent started.
    opened: dict[tuple[str, str], int] = field(default_factory=dict)


class Detection:
    """One detector per target name; its learned state is saved after every window so a restart resumes it.

    `identity(target)` names what the target serves (its command line): when it differs from the one the
    saved baseline was learned on, the baseline is dropped, since a new model or binary has a new normal. With
    `identity=None` the baseline is kept across builds: a regression a new build brings is then labelled `change`
    through `last_change` (docs/changes.md).
    """

    def __init__(self, store: FindingsStore, make_detector: Callable[[], Detector],
                 identity: Callable[[str], str | None] | None = lambda target: None,
                 listeners: Iterable[RegressionListener] = (), save_every: int = 12, closed_windows: int = 2,
                 last_change: Callable[[str], ChangeNote | None] = lambda target: None,
                 change_onset_seconds: float = DEFAULT_ONSET_SECONDS) -> None:
        """`closed_windows`: consecutive windows in which a process that had answered finds its latency port closed
        (no listening socket) before the target is down (docs/detector.md, "When the server is down").
        `last_change(target)`: the target's newest change; a regression that opens within `change_onset_seconds`
        after it, with no outside cause, is labelled `change` (analysis.change_cause, docs/changes.md)."""
        if closed_windows < 1:
            raise ValueError(f"closed_windows must be at least 1, got {closed_windows!r}")
        self._store = store
        self._make = make_detector
        self._identity = identity
        self._listeners = list(listeners)
        self._save_every = save_every
        self._closed_windows = closed_windows
        self._last_change = last_change
        self._change_onset = change_onset_seconds
        # Per target: the pid that last answered its latency endpoint, and how many windows in a row since its port
        # has been closed. A process that never answered is starting (loading its model), not down.
        self._serving: dict[str, int] = {}
        self._closed_run: dict[str, int] = {}
        self._tracked: dict[str, _Tracked] = {}
        self._findings: dict[str, TargetFinding] = {}
        self._opened: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        # Targets whose process ended (or stopped answering): their open `down` episode, kept until they answer
        # again. Restored from the store, so an agent restarted during an outage still reports it.
        self._down: dict[str, Regression] = {}
        for r in store.regressions(open_only=True, limit=1000):
            if r.top_cause == "down":
                self._down[r.target] = r
                self._findings[r.target] = _down_finding(r, armed=False)

    def add_listener(self, listener: RegressionListener) -> None:
        self._listeners.append(listener)

    def observe(self, window: Window) -> Verdict | None:
        """Feed one stored window to its target's detector; returns the detector's verdict."""
        for target in self._store.take_baseline_resets():
            self._reset(target)
        if window.target in self._down:
            if not _answers(window):
                return None  # a process that is not serving yet says nothing about the server's latency
            self._back(window)
        if self._port_closed(window):
            return None
        tracked = self._tracked_for(window.target)
        verdict = tracked.detector.update(window)
        verdict = self._with_change(window.target, verdict)
        for regression in (verdict.opened, verdict.regression, verdict.closed):
            if regression is not None:
                self._store.save_regression(regression)
        tracked.unsaved += 1
        # A baseline can hold hundreds of KB of JSON: saved every `save_every` windows, but at once while an
        # episode starts, lasts or ends, so a restart never loses an open regression.
        if verdict.opened or verdict.closed or verdict.regression or tracked.unsaved >= self._save_every:
            self._save(window.target, tracked)
        with self._lock:
            if verdict.opened is not None:
                self._opened[(window.target, verdict.opened.top_cause)] += 1
            self._findings[window.target] = TargetFinding(
                target=window.target, state=verdict.state, score=verdict.score, expected=dict(verdict.expected),
                regression=verdict.regression, window_end=window.end, armed=verdict.state != "warmup")
        self._notify(verdict)
        return verdict

    def _with_change(self, target: str, verdict: Verdict) -> Verdict:
        """The verdict's episodes with the `change` cause where it applies; applied to every window's re-ranking, since
        the detector ranks measured signals only."""
        change = self._last_change(target)
        if change is None:
            return verdict

        def label(r: Regression | None) -> Regression | None:
            return None if r is None else attribute_change(r, change, self._change_onset)
        return dataclasses.replace(verdict, regression=label(verdict.regression), opened=label(verdict.opened),
                                   closed=label(verdict.closed))

    def _save(self, target: str, tracked: _Tracked) -> None:
        self._store.save_detector_state(target, tracked.identity, tracked.detector.get_state())
        tracked.unsaved = 0

    def flush(self) -> None:
        """Save every baseline learned since its last save (at shutdown)."""
        for target, tracked in self._tracked.items():
            if tracked.unsaved:
                self._save(target, tracked)

    def _notify(self, verdict: Verdict) -> None:
        for listener in self._listeners:
            # A window may end one regression and begin the next (its cause gave way to another): the end first.
            if verdict.closed is not None:
                listener.regression_closed(verdict.closed)
            if verdict.opened is not None:
                listener.regression_opened(verdict.opened)
            elif verdict.regression is not None:
                listener.regression_updated(verdict.regression)

    def _tracked_for(self, target: str) -> _Tracked:
        # No identity rule (`identity=None`: changes are tracked, agent.changes): the baseline stays whatever runs.
        keep = self._identity is None
        identity = "" if keep else self._identity(target) or ""
        tracked = self._tracked.get(target)
        if tracked is not None and (keep or tracked.identity == identity):
            return tracked
        detector = self._make()
        saved = self._store.detector_state(target) if tracked is None else None
        if saved is not None and (keep or saved[0] == identity):
            detector.set_state(saved[1])
            log.info("target %s: baseline restored from the store", target)
        elif saved is not None or tracked is not None:
            log.info("target %s now serves something else (%s): learning a new baseline", target, identity[:120])
            self._store.delete_detector_state(target)
        self._tracked[target] = tracked = _Tracked(detector=detector, identity=identity)
        return tracked

    def target_down(self, target: str, pid: int, at: float, reason: str) -> Regression | None:
        """The target's process ended (`reason` says how) or stopped answering: an incident of its own, not a
        disappearance. Its open latency episode ends here (its windows are over), a `down` episode opens, critical,
        and is passed on like any other; the baseline stays, so the server that comes back is judged against what
        it was. Returns the new episode, or None when one is already open."""
        if target in self._down:
            return None
        tracked = self._tracked.get(target)
        if tracked is not None and (ended := tracked.detector.interrupt(at)) is not None:
            self._close(ended)
        down = Regression(id=f"{target}-down-{at:.3f}", target=target, pid=pid, opened_at=at, severity="critical",
                          score=0.0, causes=[Cause("down", 0.0, f"pid {pid} {reason}")])
        self._store.save_regression(down)
        if tracked is not None:
            self._save(target, tracked)
        with self._lock:
            self._down[target] = down
            self._opened[(target, "down")] += 1
            armed = self._findings[target].armed if target in self._findings else False
            self._findings[target] = _down_finding(down, armed)
        for listener in self._listeners:
            listener.regression_opened(down)
        return down

    def _port_closed(self, window: Window) -> bool:
        """Count the windows in which a process that answered before finds its latency port closed; at
        `closed_windows` in a row the target is down (its process lives, but serves no one). True then."""
        target = window.target
        if window.latency is not None:
            self._serving[target] = window.pid
        if "latency" not in window.closed or self._serving.get(target) != window.pid:
            self._closed_run.pop(target, None)
            return False
        run = self._closed_run[target] = self._closed_run.get(target, 0) + 1
        if run < self._closed_windows:
            return False
        why = window.errors.get("latency", "its latency port is closed")
        self.target_down(target, window.pid, window.end,
                         f"is alive but serves no one: nothing listens on its latency port for {run} windows ({why})")
        self._closed_run.pop(target, None)
        return True

    def is_down(self, target: str) -> bool:
        return target in self._down

    def _back(self, window: Window) -> None:
        with self._lock:
            down = self._down.pop(window.target)
        self._close(dataclasses.replace(down, closed_at=window.start))
        log.info("target %s is back (pid %d): its down episode %s closed", window.target, window.pid, down.id)

    def forget(self, target: str) -> None:
        """The loop stopped watching `target` (its process exited, or a regex target was renamed as its number
        of matches changed): its detector leaves memory and its series leave /metrics.

        A plain name may come back (a restarted server): its baseline is saved, open episode included, and
        resumes then, as after an agent restart. A per-process name (`spec#pid`) never does: its saved
        baseline is deleted and an open episode ends at its last window, or a regex matching short-lived
        processes would grow the store and keep alerts firing for processes long gone.
        """
        self._closed_run.pop(target, None)
        if "#" in target:
            self._serving.pop(target, None)
        with self._lock:
            tracked = self._tracked.pop(target, None)
            # A target that is down stays on /metrics and the page with its open `down` episode.
            finding = self._findings.get(target) if target in self._down else self._findings.pop(target, None)
            if target not in self._down:
                for key in [k for k in self._opened if k[0] == target]:
                    del self._opened[key]
        if "#" not in target:
            if tracked is not None and tracked.unsaved:
                self._save(target, tracked)
            return
        self._store.delete_detector_state(target)
        if finding is not None and finding.regression is not None:
            self._close(dataclasses.replace(finding.regression, closed_at=finding.window_end))

    def _close(self, closed: Regression) -> None:
        self._store.save_regression(closed)
        for listener in self._listeners:
            listener.regression_closed(closed)

    def _reset(self, target: str) -> None:
        tracked = self._tracked.get(target)
        if tracked is not None:
            tracked.detector.reset()
            log.info("target %s: baseline reset on request", target)
        if target in self._down:
            return  # forgetting a baseline does not bring the server back: its down episode stays open
        with self._lock:
            finding = self._findings.pop(target, None)
        # The episode was measured against the baseline just forgotten: it ends with it.
        if finding is not None and finding.regression is not None:
            self._close(dataclasses.replace(finding.regression, closed_at=finding.window_end))

    def snapshot(self) -> DetectionSnapshot:
        with self._lock:
            return DetectionSnapshot(findings=dict(self._findings), opened=dict(self._opened))


def _answers(window: Window) -> bool:
    """The target serves again: its latency endpoint answered this window (or it has none configured)."""
    return window.latency is not None or "latency" not in window.errors


def _down_finding(down: Regression, armed: bool) -> TargetFinding:
    return TargetFinding(target=down.target, state="down", score=None, expected={}, regression=down,
                         window_end=down.opened_at, armed=armed)


class DownState:
    """A listener that keeps the agent's state told which targets are down (their `down` episode open), for
    `infersight_target_up` and the page: a process can be alive and serve no one (its port closed)."""

    def __init__(self, set_down: Callable[[str, str | None], None]) -> None:
        self._set_down = set_down

    def regression_opened(self, regression: Regression) -> None:
        if regression.top_cause == "down":
            self._set_down(regression.target, regression.causes[0].evidence)

    def regression_updated(self, regression: Regression) -> None:
        pass  # a down episode is not re-ranked

    def regression_closed(self, regression: Regression) -> None:
        if regression.top_cause == "down":
            self._set_down(regression.target, None)
