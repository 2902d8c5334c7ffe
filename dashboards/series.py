"""Time series of stored windows for the charts, downsampled in SQLite; long ranges read the minute rollup the agent
advances (agent.store.rollup). What it rolls up is defined here: FIELDS, and when a minute is final."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

# name -> JSON path in a stored window (Store.aggregate's field syntax).
FIELDS: dict[str, str] = {
    "p50": "$.latency.p50_seconds",
    "p95": "$.latency.p95_seconds",
    "p99": "$.latency.p99_seconds",
    "rate": "$.latency.request_rate",
    "cpu": "$.process.cpu_seconds",
    "rss": "$.process.rss_bytes",
    "offcpu": "$.offcpu.seconds",
    "gc_pause": "$.gc.pause_seconds",
    "gc_collections": "$.gc.collections",
    "tcp": "$.tcp.retransmits",
    "runqueue": "$.runqueue.total_seconds",
    "syscalls": "sum($.syscalls.counts)",
}
# What the charts plot, in display units: how each comes from a bucket's sums, counts, maxes and seconds.
SERIES: dict[str, str] = {
    "p50_ms": "mean latency p50 of the windows, ms",
    "p95_ms": "mean latency p95 of the windows, ms",
    "p99_ms": "mean latency p99 of the windows, ms",
    "p99_max_ms": "worst window's latency p99, ms",
    "request_rate": "requests per second",
    "cpu_cores": "CPU seconds per second (1 = one core)",
    "rss_mb": "largest resident memory, MiB",
    "syscalls_per_s": "system calls per second",
    "offcpu_per_s": "off-CPU seconds per second, summed over threads",
    "gc_pause_ms_per_s": "GC pause ms per second",
    "gc_collections_per_s": "GC collections per second",
    "tcp_retransmits_per_s": "TCP retransmits per second",
    "runqueue_ms_per_s": "run-queue wait ms per second, summed over threads",
}
MINUTE = 60.0
# Ranges up to this long are aggregated straight from the store; longer ones from the minute cache.
DIRECT_MAX_SECONDS = 3 * 3600.0
# A bucket is final once no window starting in it can still arrive (a window is stored when it ends).
SETTLE_SECONDS = 2 * MINUTE + 60.0
CACHE_MAX_SECONDS = 8 * 86400.0
MAX_POINTS = 2000


# Stored with the rolled-up minutes: rows rolled up for other fields are stale and get rebuilt.
FIELDS_KEY = json.dumps(FIELDS, sort_keys=True, separators=(",", ":"))


class AggregatingStore(Protocol):
    def aggregate(self, target: str, since: float, until: float, bucket_seconds: float,
                  fields: dict[str, str]) -> list[Any]: ...


class RollupStore(AggregatingStore, Protocol):
    def rollup_progress(self, target: str) -> tuple[float, str] | None: ...

    def rollup_minutes(self, target: str, since: float, until: float) -> list[dict]: ...


@dataclass
class Bucket:
    start: float
    windows: int
    seconds: float
    sums: dict[str, float]
    counts: dict[str, int]
    maxes: dict[str, float | None]

    @classmethod
    def of(cls, agg: Any) -> Bucket:
        return cls(agg.start, agg.windows, agg.seconds, {k: v or 0.0 for k, v in agg.sums.items()},
                   dict(agg.counts), dict(agg.maxes))

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Bucket:
        """A minute as the store's rollup keeps it (missing fields, from an older set, count as unmeasured)."""
        return cls(row["start"], row["windows"], row["seconds"],
                   {k: row["sums"].get(k) or 0.0 for k in FIELDS}, {k: row["counts"].get(k, 0) for k in FIELDS},
                   {k: row["maxes"].get(k) for k in FIELDS})

    def add(self, other: Bucket) -> None:
        self.windows += other.windows
        self.seconds += other.seconds
        for k in self.sums:
            self.sums[k] += other.sums[k]
            self.counts[k] += other.counts[k]
            a, b = self.maxes[k], other.maxes[k]
            self.maxes[k] = b if a is None else a if b is None else max(a, b)


def derive(b: Bucket) -> dict[str, float | None]:
    """A bucket's chart values; a field no window measured is None, never 0."""

    def mean(k: str, scale: float = 1.0) -> float | None:
        return b.sums[k] / b.counts[k] * scale if b.counts[k] else None

    def per_s(k: str, scale: float = 1.0) -> float | None:
        return b.sums[k] / b.seconds * scale if b.counts[k] and b.seconds > 0 else None

    def peak(k: str, scale: float = 1.0) -> float | None:
        return b.maxes[k] * scale if b.counts[k] and b.maxes[k] is not None else None

    return {"p50_ms": mean("p50", 1e3), "p95_ms": mean("p95", 1e3), "p99_ms": mean("p99", 1e3),
            "p99_max_ms": peak("p99", 1e3), "request_rate": mean("rate"), "cpu_cores": per_s("cpu"),
            "rss_mb": peak("rss", 1 / 2**20), "syscalls_per_s": per_s("syscalls"), "offcpu_per_s": per_s("offcpu"),
            "gc_pause_ms_per_s": per_s("gc_pause", 1e3), "gc_collections_per_s": per_s("gc_collections"),
            "tcp_retransmits_per_s": per_s("tcp"), "runqueue_ms_per_s": per_s("runqueue", 1e3)}


def minute_buckets(store: RollupStore, target: str, since: float, until: float) -> list[Bucket]:
    """Minute buckets of [since, until): the agent's rolled-up minutes, then the windows since its last roll
    (the page never writes the rollup; without one, every minute comes from the windows)."""
    since = math.floor(since / MINUTE) * MINUTE
    progress = store.rollup_progress(target)
    done = progress[0] if progress is not None and progress[1] == FIELDS_KEY else since
    found = [Bucket.from_row(r) for r in store.rollup_minutes(target, since, min(until, done))]
    if until > done:
        found += [Bucket.of(a) for a in store.aggregate(target, max(done, since), until, MINUTE, FIELDS)]
    return found


def series(store: RollupStore, target: str, since: float, until: float, points: int,
           min_step: float = 1.0) -> dict[str, Any]:
    """Aligned arrays for uPlot: bucket starts and one array per SERIES name, at most `points` long.

    Buckets are never shorter than `min_step` (the collection interval): shorter ones would alternate between
    holding one window and none. Ranges over DIRECT_MAX_SECONDS read the agent's minute rollup."""
    span = until - since
    step = max(span / points, min_step)
    if span <= DIRECT_MAX_SECONDS:
        buckets = [Bucket.of(a) for a in store.aggregate(target, since, until, step, FIELDS)]
    else:
        step = math.ceil(step / MINUTE) * MINUTE
        merged: dict[float, Bucket] = {}
        for b in minute_buckets(store, target, since, until):
            key = math.floor(b.start / step) * step
            if key in merged:
                merged[key].add(b)
            else:
                merged[key] = Bucket(key, b.windows, b.seconds, dict(b.sums), dict(b.counts), dict(b.maxes))
        buckets = [merged[k] for k in sorted(merged)]
    rows = [derive(b) for b in buckets]
    return {"target": target, "from": since, "to": until, "step": step,
            "t": [b.start for b in buckets], "windows": [b.windows for b in buckets],
            "series": {name: [_round(r[name]) for r in rows] for name in SERIES}}


def _round(v: float | None) -> float | None:
    return None if v is None else float(f"{v:.4g}")
