"""The collection loop: find targets, read every source once per tick, emit one Window per target."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from agent.collectors import Collected, Collectors
from agent.state import AgentState
from agent.targets import Target, diff_targets, discover
from analysis.errors import ProbeError
from analysis.health import Health
from analysis.redact import redact_cmdline
from analysis.snapshot import TargetStatus
from analysis.window import Window
from probes.exits import ProcessExit

log = logging.getLogger("infersight.loop")


class WindowSink(Protocol):
    def __call__(self, window: Window) -> None: ...


class ExitWatcher(Protocol):
    """Says how a watched process ended (probes/exits.py); the loop asks once a target's process is gone."""

    def start(self, targets: Iterable[int]) -> None: ...
    def set_targets(self, targets: Iterable[int]) -> None: ...
    def exit_of(self, pid: int) -> ProcessExit | None: ...
    def health(self) -> Health: ...
    def stop(self) -> None: ...


class DownListener(Protocol):
    def __call__(self, target: str, pid: int, at: float, reason: str) -> None: ...


@dataclass
class Watched:
    target: Target
    window_start: float
    windows: int = 0


@dataclass
class TickReport:
    windows: list[Window] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    late: bool = False


class CollectionLoop:
    def __init__(self, specs: Iterable, collectors: Collectors, state: AgentState, sink: WindowSink,
                 interval: float = 5.0, discover_fn: Callable[[list, dict[str, str]], list[Target]] | None = None,
                 wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 on_forget: Callable[[str], None] | None = None, exits: ExitWatcher | None = None,
                 on_down: DownListener | None = None) -> None:
        """`on_forget(name)` is called when a target name stops being watched (exited, or renamed), so what
        else keeps per-target state (the detector) drops it too. `on_down(name, pid, at, reason)` is called first
        when the process of a named target (not a per-process `name#pid` one) ended: the server is down, an
        incident. `exits` says how a process ended (killed by which signal from whom, its exit status)."""
        self._specs = list(specs)
        self._collectors = collectors
        self._state = state
        self._sink = sink
        self.interval = interval
        self._discover = discover_fn or (lambda specs, problems: discover(specs, problems=problems))
        self._wall = wall
        self._monotonic = monotonic
        self._on_forget = on_forget or (lambda name: None)
        self._on_down = on_down or (lambda name, pid, at, reason: None)
        self._exits = exits
        self._exits_error: str | None = None
        self._watched: dict[tuple[int, int], Watched] = {}
        self._gone: set[str] = set()
        self._started = False

    @property
    def watched(self) -> list[Target]:
        return [w.target for w in self._watched.values()]

    def start(self) -> None:
        targets = self._find()
        now = self._wall()
        for t in targets:
            self._watch(t, now)
        self._collectors.start(targets)
        self._start_exits(targets)
        # Compiling the probes takes seconds, and each counted from its own attach: read once and drop
        # it, so every source's first window starts at the same moment.
        attached = self._wall()
        self._collectors.read()
        for watched in self._watched.values():
            watched.window_start = attached
        self._publish_health()
        self._started = True

    def _start_exits(self, targets: list[Target]) -> None:
        if self._exits is None:
            return
        try:
            self._exits.start([t.pid for t in targets])
        except (ProbeError, OSError, ValueError) as exc:
            # Exits are then told without how (status, signal): said so in the reason and the probe's health.
            self._exits_error = str(exc)
            log.warning("exit probe unavailable: %s", exc)
            self._exits = None

    def _exit_reason(self, pid: int) -> str:
        """How `pid` ended, as one line: the exit probe's record, else why that is not known."""
        if self._exits is None:
            return ("exited (how is not measured: " + (self._exits_error or "the exits probe is off") + ")")
        try:
            found = self._exits.exit_of(pid)
        except (ProbeError, OSError, ValueError) as exc:
            return f"exited (how could not be read: {exc})"
        return found.describe() if found is not None else "exited; how was not seen by the exits probe"

    def _find(self) -> list[Target]:
        problems: dict[str, str] = {}
        try:
            found = self._discover(self._specs, problems)
        except (ProbeError, OSError) as exc:
            self._state.count_error("discovery")
            log.warning("target discovery failed: %s", exc)
            return [w.target for w in self._watched.values()]
        watched_names = {t.name for t in found}
        now = self._wall()
        for name, why in problems.items():
            # A spec that finds nothing is shown with its reason; a target that was watched stays "down".
            if name not in watched_names and name not in self._gone:
                self._state.set_target(TargetStatus(name=name, pid=None, state="waiting", since=now, detail=why))
        return found

    def _watch(self, t: Target, now: float) -> None:
        self._gone.discard(t.name)
        self._watched[t.key] = Watched(target=t, window_start=now)
        self._state.set_target(self._watching(t, now))
        log.info("watching target %s pid %d", t.name, t.pid)
        for problem in t.family_problems:
            log.warning("target %s: %s", t.name, problem)

    @staticmethod
    def _watching(t: Target, since: float) -> TargetStatus:
        return TargetStatus(name=t.name, pid=t.pid, state="watching", since=since,
                            detail=redact_cmdline(t.cmdline)[:300], members=len(t.members) or None,
                            problems=t.family_problems)

    def tick(self) -> TickReport:
        """One window per watched target; then pick up new targets and drop vanished ones."""
        if not self._started:
            raise RuntimeError("call start() before tick()")
        report = TickReport()
        began = self._monotonic()
        # The window ends where the probes' reads begin: the off-CPU probe, read first, cuts its open
        # intervals right here (its read then spends a while symbolising stacks).
        end = self._wall()
        collected = self._collectors.read()
        if (host_tcp := self._collectors.host.get("tcp")) is not None:
            self._state.add_host_retransmits(host_tcp.retransmits)

        for key, watched in list(self._watched.items()):
            window = self._build_window(watched, end, collected.get(key, Collected()))
            try:
                self._sink(window)
            except Exception as exc:  # the store failing must not stop collection; counted and shown
                self._state.count_dropped_window()
                self._state.count_error("store")
                log.error("window for %s not stored: %s", watched.target.name, exc)
            else:
                self._state.record_window(window)
                report.windows.append(window)
            watched.window_start = end
            watched.windows += 1

        self._rediscover(end, report)
        self._publish_health()
        self._state.last_tick_seconds = self._monotonic() - began
        return report

    @staticmethod
    def _build_window(watched: Watched, end: float, collected: Collected) -> Window:
        t = watched.target
        w = Window(target=t.name, pid=t.pid, start=watched.window_start, end=end)
        for name, reading in collected.readings.items():
            setattr(w, name, reading)
        w.errors.update(collected.missing)
        w.unanswered = sorted(collected.unanswered)
        w.unreachable = sorted(collected.unreachable)
        w.closed = sorted(collected.closed)
        w.members = collected.members
        return w

    def _rediscover(self, now: float, report: TickReport) -> None:
        current = self._find()
        diff = diff_targets(self.watched, current)
        for t in diff.same:
            # A regex target is renamed when its number of matches changes (name <-> name#pid).
            if (old := self._watched[t.key].target.name) != t.name:
                self._state.forget_target(old)
                self._on_forget(old)
                self._state.set_target(self._watching(t, now))
            before = self._watched[t.key].target
            if (before.members, before.family_problems) != (t.members, t.family_problems):
                # The family changed (a member came or went, a problem appeared or cleared): shown at once, and
                # each new problem logged once.
                for problem in set(t.family_problems) - set(before.family_problems):
                    log.warning("target %s: %s", t.name, problem)
                self._state.set_target(self._watching(t, self._state.target_since(t.name, now)))
            self._watched[t.key].target = t
        for t in diff.removed:
            self._watched.pop(t.key)
            reason = self._exit_reason(t.pid)
            if "#" in t.name:
                # One of several processes a regex matched: it leaves with its process, no incident of its own.
                self._state.forget_target(t.name)
                self._on_forget(t.name)
                log.info("target %s pid %d %s", t.name, t.pid, reason)
            else:
                # The server named in the config is down: it stays on the page and /metrics (up 0) with how it
                # ended, its counters kept, until a process of it is back.
                self._gone.add(t.name)
                self._state.set_target(TargetStatus(name=t.name, pid=t.pid, state="down", since=now,
                                                    detail=f"pid {t.pid} {reason}"))
                self._state.mark_down(t.name)
                self._on_down(t.name, t.pid, now, reason)
                self._on_forget(t.name)
                log.warning("target %s is down: pid %d %s", t.name, t.pid, reason)
            report.gone.append(t.name)
        for t in diff.added:
            self._watch(t, now)
            report.added.append(t.name)
        self._collectors.set_targets(self.watched)
        if self._exits is not None:
            try:
                self._exits.set_targets([t.pid for t in self.watched])
            except (ProbeError, OSError, ValueError) as exc:
                log.warning("exit probe could not change targets: %s", exc)

    def _publish_health(self) -> None:
        for name, health in self._collectors.health().items():
            self._state.set_health(name, health)
        if self._exits is not None:
            self._state.set_health("exits", self._exits.health())
        elif self._exits_error is not None:
            self._state.set_health("exits", Health(name="exits", state="failed", reason=self._exits_error))

    def run(self, stop: threading.Event) -> None:
        """Tick every `interval` seconds on a fixed schedule until `stop` is set; a late tick is counted."""
        if not self._started:
            self.start()
        deadline = self._monotonic() + self.interval
        late = False
        while not stop.wait(max(0.0, deadline - self._monotonic())):
            lateness = self._monotonic() - deadline
            if late or lateness > self.interval * 0.5:
                self._state.count_late_tick()
                log.warning("tick started %.2f s late; its window is that much longer", max(lateness, 0.0))
            try:
                self.tick()
            except Exception:  # the main loop is the one place that catches broadly: it logs and counts
                self._state.count_error("loop")
                log.exception("collection tick failed")
            deadline += self.interval
            # A tick that overran its slot: the next one starts now (late, counted) rather than
            # firing a burst of catch-up ticks.
            late = self._monotonic() > deadline
            if late:
                deadline = self._monotonic()

    def close(self) -> None:
        self._watched.clear()
        self._collectors.stop()
        if self._exits is not None:
            self._exits.stop()
