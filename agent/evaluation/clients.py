"""What the load generator's clients saw, per agent window, beside the window in a recording (never in it).

The load generator writes one line per finished request (workload.loadgen.request_line): the wall-clock time its
reply's last byte arrived and its latency. Each request is binned by the window its reply finished in, on the
agent's own window bounds [start, end), so scoring can set the agent's clients' latency estimate
(analysis/client_latency.py) beside what the clients measured (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.evaluation.recording import LabelledWindow

# The share of windows whose estimate lies within this fraction of the clients' measured p99 (the issue's goal).
WITHIN = 0.20


@dataclass(frozen=True)
class RequestTiming:
    end: float  # wall-clock seconds the reply finished at the client
    latency_s: float
    ok: bool


@dataclass(frozen=True)
class ClientFigures:
    """The clients' own latency over one window: nearest-rank quantiles of the requests that succeeded in it (None
    when none did), and how many failed."""

    requests: int
    failed: int
    p50_seconds: float | None
    p95_seconds: float | None
    p99_seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "failed": self.failed, "p50_seconds": self.p50_seconds,
                "p95_seconds": self.p95_seconds, "p99_seconds": self.p99_seconds}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClientFigures:
        def seconds(key: str) -> float | None:
            value = data.get(key)
            return None if value is None else float(value)

        return cls(int(data["requests"]), int(data["failed"]), seconds("p50_seconds"), seconds("p95_seconds"),
                   seconds("p99_seconds"))


def parse_line(line: str) -> RequestTiming | None:
    """One request line; None for a line that is not one (a torn last line, the load's own summary)."""
    try:
        row = json.loads(line)
        timing = RequestTiming(float(row["end"]), float(row["latency_s"]), bool(row["ok"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    return timing if math.isfinite(timing.end) and math.isfinite(timing.latency_s) else None


def nearest_rank(ordered: list[float], q: float) -> float:
    """The load generator's own definition (workload.stats.percentile): the value at rank ceil(q * n)."""
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def figures(timings: list[RequestTiming], start: float, end: float) -> ClientFigures:
    """The requests whose reply finished in [start, end)."""
    inside = [t for t in timings if start <= t.end < end]
    ok = sorted(t.latency_s for t in inside if t.ok)
    p50, p95, p99 = (nearest_rank(ok, q) if ok else None for q in (0.5, 0.95, 0.99))
    return ClientFigures(len(inside), len(inside) - len(ok), p50, p95, p99)


class RequestsLog:
    """Reads the load generator's requests log as it grows: complete lines only, so a line half written when read is
    taken whole on the next read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.timings: list[RequestTiming] = []

    def read(self) -> list[RequestTiming]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:  # the load has not finished a request yet
            return self.timings
        complete = data.rfind(b"\n") + 1
        self._offset += complete
        for line in data[:complete].decode("utf-8", errors="replace").splitlines():
            timing = parse_line(line)
            if timing is not None:
                self.timings.append(timing)
        return self.timings


class OneWindowLate:
    """Hands each window on (to a recording) one window late, with the clients' figures for it: a reply that finished
    just before the window closed may be logged a moment after, and by the next window's close it has been."""

    def __init__(self, log: RequestsLog, emit: Callable[[LabelledWindow], None]) -> None:
        self.log = log
        self.emit = emit
        self._pending: LabelledWindow | None = None

    def add(self, item: LabelledWindow) -> None:
        self.flush()
        self._pending = item

    def flush(self) -> None:
        """Emits the held window; call it once the load has ended, before the recording closes."""
        if self._pending is None:
            return
        item, self._pending = self._pending, None
        item.clients = figures(self.log.read(), item.window.start, item.window.end)
        self.emit(item)


def compare(windows: list[LabelledWindow]) -> dict[str, Any] | None:
    """The agent's clients' p99 estimate beside the clients' measured p99, per window that has both, and the share of
    those within WITHIN of it (all windows, and the fault phases' alone); None for a run without the clients' figures
    (recorded before they were)."""
    from analysis.client_latency import estimate

    if not any(item.clients is not None for item in windows):
        return None
    rows = []
    for n, item in enumerate(windows):
        measured = item.clients.p99_seconds if item.clients is not None else None
        guess = estimate(item.window.latency, item.window.delivery)
        if measured is None or guess is None or measured <= 0:
            continue
        ratio = guess.p99_seconds / measured
        rows.append({"window": n, "label": item.label, "phase": item.phase, "requests": item.clients.requests,
                     "estimate_p99": guess.p99_seconds, "clients_p99": measured, "ratio": ratio,
                     "within": abs(ratio - 1.0) <= WITHIN})

    def share(chosen: list[dict[str, Any]]) -> float | None:
        return sum(r["within"] for r in chosen) / len(chosen) if chosen else None

    fault = [r for r in rows if r["label"] != "normal"]
    return {"windows": len(rows), "within": WITHIN, "share_within": share(rows), "fault_windows": len(fault),
            "fault_share_within": share(fault), "per_window": rows}
