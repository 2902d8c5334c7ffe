"""The agent's live state: latest window and running totals per target, collector health, self counters."""

from __future__ import annotations

import threading
import time
from collections import Counter

from analysis.health import Health
from analysis.snapshot import Skipped, Snapshot, TargetStatus, TargetTotals, copy_totals
from analysis.window import Window


class AgentState:
    """Shared between the collection thread (writer) and the web threads (readers); one lock guards it."""

    def __init__(self, clock=time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.started = clock()
        self._latest: dict[str, Window] = {}
        self._totals: dict[str, TargetTotals] = {}
        self._targets: dict[str, TargetStatus] = {}
        self._health: dict[str, Health] = {}
        self._skipped: dict[str, Skipped] = {}
        self.host_tcp_retransmits = 0
        self.errors: Counter = Counter()  # source -> errors
        self.windows_written = 0
        self.late_ticks = 0
        self.dropped_windows = 0
        self.last_tick_seconds = 0.0

    def record_window(self, w: Window) -> None:
        with self._lock:
            self._latest[w.target] = w
            self._totals.setdefault(w.target, TargetTotals()).add(w)
            self.windows_written += 1
            for source in w.errors:
                self.errors[source] += 1

    def set_target(self, status: TargetStatus) -> None:
        with self._lock:
            self._targets[status.name] = status

    def set_skipped(self, skipped: dict[str, Skipped]) -> None:
        with self._lock:
            self._skipped = dict(skipped)

    def forget_target(self, name: str) -> None:
        """Drop an exited target's figures, so /metrics stops exposing its series (a regex target that
        matches short-lived processes would otherwise leave series behind for every pid it ever saw).
        A per-process name (`spec#pid`) leaves the page too; a plain name stays listed as gone."""
        with self._lock:
            self._latest.pop(name, None)
            self._totals.pop(name, None)
            for source in [s for s in self._health if s.endswith(f":{name}")]:
                del self._health[source]
            if "#" in name:
                self._targets.pop(name, None)

    def set_health(self, source: str, health: Health) -> None:
        with self._lock:
            self._health[source] = health.copy()

    def count_error(self, source: str, n: int = 1) -> None:
        with self._lock:
            self.errors[source] += n

    def count_late_tick(self) -> None:
        with self._lock:
            self.late_ticks += 1

    def count_dropped_window(self) -> None:
        with self._lock:
            self.dropped_windows += 1

    def add_host_retransmits(self, n: int) -> None:
        with self._lock:
            self.host_tcp_retransmits += n

    def snapshot(self) -> Snapshot:
        """A consistent copy for readers; windows are replaced, never mutated, so sharing them is safe."""
        with self._lock:
            return Snapshot(
                started=self.started,
                now=self._clock(),
                latest=dict(self._latest),
                totals={k: copy_totals(v) for k, v in self._totals.items()},
                targets=dict(self._targets),
                health={k: v.copy() for k, v in self._health.items()},
                errors=dict(self.errors),
                host_tcp_retransmits=self.host_tcp_retransmits,
                windows_written=self.windows_written,
                late_ticks=self.late_ticks,
                dropped_windows=self.dropped_windows,
                last_tick_seconds=self.last_tick_seconds,
                skipped=dict(self._skipped),
            )
