"""The processes a disk-bound `blocked` cause names: who wrote to the disks while the server's I/O stalled, over the
episode's windows (the readings come from agent/sources/disk_writers.py through the pressure source)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from analysis.regression import Cause, Writer
from analysis.window import Window

# Writers a cause names in its evidence (up to TOP are in its `writers`).
NAMED = 2
TOP = 3
# The I/O stall must have moved for its writers to explain the cause: the episode's median at least this many times
# the baseline's, and at least the `io_pressure` signal's floor (1 % of the time). A `blocked` cause from a stop or
# a sleep, on a host whose disk is as busy as ever, names nobody.
IO_RISE = 2.0
IO_FLOOR = 0.01


def sample(window: Window) -> dict[str, Any] | None:
    """What the detector keeps of a window's writers among its per-window values (JSON: they travel in its saved
    state); None when the window did not read them."""
    p = window.pressure
    if p is None or p.writers is None:
        return None
    return {"seconds": max((w.seconds for w in p.writers), default=window.duration),
            "top": [{"pid": w.pid, "comm": w.comm, "written_bytes": w.written_bytes, "member": w.member,
                     "cmdline": w.cmdline, "user": w.user, "seconds": w.seconds} for w in p.writers]}


def io_moved(samples: Sequence[dict[str, Any]], usual: float | None) -> bool:
    """Whether the server's I/O stall (the `io_pressure` signal, s/s) over the episode's windows stood at least
    IO_RISE times its baseline median and above IO_FLOOR; False where it was not measured."""
    seen = [s["io_pressure"] for s in samples if isinstance(s.get("io_pressure"), (int, float))]
    if not seen:
        return False
    now = statistics.median(seen)
    return now >= IO_FLOOR and (usual is None or now >= IO_RISE * usual)


def describe(w: Writer) -> str:
    who = f"the server's own pid {w.pid}" if w.member else f"pid {w.pid}"
    what = w.cmdline or w.comm
    user = f" (user {w.user})" if w.user else ""
    rate = f", {w.written_bytes / (1 << 20) / w.seconds:.1f} MiB/s" if w.seconds > 0 else ""
    return f"{who} `{what}`{user} wrote {w.written_bytes / (1 << 20):.0f} MiB in {w.seconds:.0f} s{rate}"


def named(cause: Cause, samples: Sequence[dict[str, Any]], usual_io: float | None) -> Cause:
    """A `blocked` cause whose I/O stall moved (io_moved) with the processes that wrote most over the episode's
    windows (bytes summed by pid, over the seconds of the readings that named that process, each reading's seconds
    the writer's own: a neighbour that started within the episode is not said to have written its bytes over time
    before it ran), in its evidence and its `writers`; any other cause, or one with no writer read, as it is."""
    if cause.label != "blocked" or not io_moved(samples, usual_io):
        return cause
    kept = [s["writers"] for s in samples if isinstance(s.get("writers"), dict)]
    rows: dict[int, dict[str, Any]] = {}
    for k in kept:
        for w in k["top"]:
            row = rows.setdefault(w["pid"], {**w, "written_bytes": 0, "seconds": 0.0})
            row["written_bytes"] += w["written_bytes"]
            row["seconds"] += w.get("seconds", k["seconds"])  # a state saved before per-writer seconds: the read's
    if not rows:
        return cause
    found = tuple(Writer(**{**r, "seconds": round(r["seconds"], 3)})
                  for r in sorted(rows.values(), key=lambda r: -r["written_bytes"])[:TOP])
    words = "; ".join(describe(w) for w in found[:NAMED])
    return dataclasses.replace(cause, evidence=f"{cause.evidence}; {words}", writers=found)
