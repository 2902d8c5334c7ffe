"""The agent's live state: latest window and running totals per target, collector health, self counters."""

from __future__ import annotations

import threading
import time
from collections import Counter

from analysis.health import Health
from analysis.snapshot import Skipped, Snapshot, TargetStatus, TargetTotals, copy_totals
from analysis.window import READINGS, Window

# The agent's own work that can fail (count_error's names); each starts at 0, so its series exists before it fails.
AGENT_PARTS = ("alerts", "detector", "discovery", "identity", "loop", "otlp", "retention", "rollup", "store")


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
        self._down: dict[str, str] = {}
        self.host_tcp_retransmits = 0
        # Failures of the agent's own work, by part. A collector's failed reads are in its Health, not here.
        self.agent_errors: Counter = Counter(dict.fromkeys(AGENT_PARTS, 0))
        # Windows recorded without a reading, by Window field: failed or unsupported alike (the window says which).
        self.missing_readings: Counter = Counter(dict.fromkeys(READINGS, 0))
        self.windows_written = 0
        self.late_ticks = 0
        self.dropped_windows = 0
        self.last_tick_seconds = 0.0

    def record_window(self, w: Window) -> None:
        with self._lock:
            self._latest[w.target] = w
            self._totals.setdefault(w.target, TargetTotals()).add(w)
            self.windows_written += 1
            for field_name in w.errors:
                self.missing_readings[field_name] += 1

    def set_target(self, status: TargetStatus) -> None:
        with self._lock:
            self._targets[status.name] = status

    def target_since(self, name: str, default: float) -> float:
        """Since when the target has been in its current state; `default` for one not known."""
        with self._lock:
            status = self._targets.get(name)
            return status.since if status is not None else default

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

    def mark_down(self, name: str) -> None:
        """A named target's process ended: its gauges (the last window, its sources' health) go, since they
        describe a process that is no more; its counters stay, as a counter does when its process restarts."""
        with self._lock:
            self._latest.pop(name, None)
            for source in [s for s in self._health if s.endswith(f":{name}")]:
                del self._health[source]

    def set_down(self, name: str, reason: str | None) -> None:
        """`reason` while the target's `down` episode is open (it serves no one), None once it serves again."""
        with self._lock:
            if reason is None:
                self._down.pop(name, None)
            else:
                self._down[name] = reason

    def set_health(self, source: str, health: Health) -> None:
        with self._lock:
            self._health[source] = health.copy()

    def count_error(self, part: str, n: int = 1) -> None:
        """One failure of the agent's own work (`part`: one of AGENT_PARTS)."""
        with self._lock:
            self.agent_errors[part] += n

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
                agent_errors=dict(self.agent_errors),
                missing_readings=dict(self.missing_readings),
                host_tcp_retransmits=self.host_tcp_retransmits,
                windows_written=self.windows_written,
                late_ticks=self.late_ticks,
                dropped_windows=self.dropped_windows,
                last_tick_seconds=self.last_tick_seconds,
                skipped=dict(self._skipped),
                down=dict(self._down),
            )
