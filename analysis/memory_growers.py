"""The processes a `memory` cause names: who grew in memory while the server's memory stalled, over the episode's
windows (the readings come from agent/sources/memory_growers.py through the pressure source)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from analysis.regression import Cause, Grower
from analysis.window import Window

# Growers a memory cause names in its evidence (all are in its `growers`).
NAMED = 2


def sample(window: Window) -> list[dict[str, Any]] | None:
    """What the detector keeps of a window's growers among its per-window values (JSON: they travel in its saved
    state); None when the window did not read them."""
    p = window.pressure
    if p is None or p.growers is None:
        return None
    return [{"pid": g.pid, "comm": g.comm, "grew_bytes": g.grew_bytes, "seconds": g.seconds, "member": g.member,
             "cmdline": g.cmdline, "user": g.user} for g in p.growers]


def describe(g: Grower) -> str:
    who = f"the server's own pid {g.pid}" if g.member else f"pid {g.pid}"
    what = g.cmdline or g.comm
    user = f" (user {g.user})" if g.user else ""
    return f"{who} `{what}`{user} grew by {g.grew_bytes / (1 << 20):.0f} MiB in {g.seconds:.0f} s"


def named(cause: Cause, samples: Sequence[dict[str, Any]]) -> Cause:
    """A memory cause with the processes that grew most over the episode's windows (each at its largest reading),
    in its evidence and its `growers`; any other cause, or one with no grower read, as it is."""
    if cause.label != "memory":
        return cause
    best: dict[int, dict[str, Any]] = {}
    for s in samples:
        for g in s.get("growers") or ():
            if g["pid"] not in best or g["grew_bytes"] > best[g["pid"]]["grew_bytes"]:
                best[g["pid"]] = g
    if not best:
        return cause
    found = tuple(Grower(**g) for g in sorted(best.values(), key=lambda g: -g["grew_bytes"])[:3])
    words = "; ".join(describe(g) for g in found[:NAMED])
    return dataclasses.replace(cause, evidence=f"{cause.evidence}; {words}", growers=found)
