"""The agent's live state: latest window and running totals per target, source health, self counters."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from analysis.window import Log2Histogram, Window


@dataclass
class TargetTotals:
    """Monotonic totals since the agent started watching a target: what Prometheus counters expose."""

    pid: int = 0
    syscalls: Counter = field(default_factory=Counter)
    offcpu_seconds: float = 0.0
    gc_collections: int = 0
    gc_pause_seconds: float = 0.0
    gc_pause_histogram: Log2Histogram = field(default_factory=lambda: Log2Histogram(unit="us"))
    runqueue_histogram: Log2Histogram = field(default_factory=lambda: Log2Histogram(unit="us"))
    runqueue_seconds: float = 0.0
    tcp_retransmits: int = 0
    cpu_seconds: float = 0.0
    requests: float = 0.0
    windows: int = 0

    def add(self, w: Window) -> None:
        self.pid = w.pid
        self.windows += 1
        if w.syscalls:
            self.syscalls.update(w.syscalls.counts)
        if w.offcpu:
            self.offcpu_seconds += w.offcpu.seconds
        if w.gc:
            self.gc_collections += w.gc.collections
            self.gc_pause_seconds += w.gc.pause_seconds
            self.gc_pause_histogram.add(w.gc.histogram)
        if w.runqueue:
            self.runqueue_histogram.add(w.runqueue.histogram)
            self.runqueue_seconds += w.runqueue.total_seconds
        if w.tcp:
            self.tcp_retransmits += w.tcp.retransmits
        if w.process:
            self.cpu_seconds += w.process.cpu_seconds
        if w.latency:
            self.requests += w.latency.requests


@dataclass
class TargetStatus:
    name: str
    pid: int | None
    state: str  # watching | gone | waiting
    since: float
    detail: str = ""


class AgentState:
    """Shared between the collection thread (writer) and the web threads (readers); one lock guards it."""

    def __init__(self, clock=time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.started = clock()
        self._latest: dict[str, Window] = {}
        self._totals: dict[str, TargetTotals] = {}
        self._targets: dict[str, TargetStatus] = {}
        self._health: dict[str, dict[str, Any]] = {}
        self._skipped: dict[str, Any] = {}  # spec name -> agent.targets.Skipped
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

    def set_skipped(self, skipped: dict[str, Any]) -> None:
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

    def set_health(self, source: str, health: dict[str, Any]) -> None:
        with self._lock:
            self._health[source] = dict(health)

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

    def snapshot(self) -> dict[str, Any]:
        """A consistent copy for readers; windows are replaced, never mutated, so sharing them is safe."""
        with self._lock:
            return {
                "started": self.started,
                "now": self._clock(),
                "latest": dict(self._latest),
                "totals": {k: _copy_totals(v) for k, v in self._totals.items()},
                "targets": dict(self._targets),
                "health": {k: dict(v) for k, v in self._health.items()},
                "skipped": dict(self._skipped),
                "errors": dict(self.errors),
                "host_tcp_retransmits": self.host_tcp_retransmits,
                "windows_written": self.windows_written,
                "late_ticks": self.late_ticks,
                "dropped_windows": self.dropped_windows,
                "last_tick_seconds": self.last_tick_seconds,
            }


def _copy_totals(t: TargetTotals) -> TargetTotals:
    return TargetTotals(
        pid=t.pid, syscalls=Counter(t.syscalls), offcpu_seconds=t.offcpu_seconds,
        gc_collections=t.gc_collections, gc_pause_seconds=t.gc_pause_seconds,
        gc_pause_histogram=Log2Histogram(unit=t.gc_pause_histogram.unit, counts=list(t.gc_pause_histogram.counts)),
        runqueue_histogram=Log2Histogram(unit=t.runqueue_histogram.unit, counts=list(t.runqueue_histogram.counts)),
        runqueue_seconds=t.runqueue_seconds, tcp_retransmits=t.tcp_retransmits, cpu_seconds=t.cpu_seconds,
        requests=t.requests, windows=t.windows)
