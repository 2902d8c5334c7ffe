"""Trace ids of slow requests for a regression's record: the OpenMetrics exemplars a target attaches to its latency
histogram (the bundled workload with traces on, vLLM with tracing), read once per OTLP export.

A second GET of the target's latency URL asking for OpenMetrics, with the latency scrape's limits (one deadline,
bounded body and lines: agent.sources.scrape.Exchange), keeping only the histogram's bucket lines. A target that
answers the text format has no exemplars and costs that GET only. Held per target: the latest MAX_KEPT distinct
trace ids with their value and time, so memory is bounded whatever the target sends. Only 32-hex-digit trace ids
are kept: nothing else of the target's text reaches a record."""

from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from agent.sources.scrape import Exchange, Limits
from analysis.errors import ReadingError

ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
MAX_KEPT = 64
# `NAME_bucket{...} COUNT # {trace_id="..."} VALUE [TIMESTAMP]` (OpenMetrics exemplar syntax).
_EXEMPLAR = re.compile(r'# \{(?:[^}]*,)?\s*trace_id="([0-9a-f]{32})"[^}]*\} ([0-9.eE+-]+)(?: ([0-9.eE+-]+))?\s*$')


@dataclass(frozen=True)
class Exemplar:
    trace_id: str
    value_seconds: float
    at: float


def parse_exemplars(text: str, bucket_name: str, now: float) -> list[Exemplar]:
    out = []
    for line in text.splitlines():
        if not line.startswith(bucket_name):
            continue
        m = _EXEMPLAR.search(line)
        if m is None:
            continue
        try:
            value = float(m.group(2))
            at = float(m.group(3)) if m.group(3) else now
        except ValueError:
            continue
        out.append(Exemplar(m.group(1), value, at))
    return out


class ExemplarWatch:
    """`poll()` from the OTLP metrics thread; `trace_ids()` from the detector's listener."""

    def __init__(self, targets: Iterable[tuple[str, str, str, float]], clock: Callable[[], float] = time.time) -> None:
        # (target name, latency URL, histogram name, scrape deadline seconds)
        self._targets = list(targets)
        self._clock = clock
        self._kept: dict[str, deque[Exemplar]] = {name: deque(maxlen=MAX_KEPT) for name, *_ in self._targets}
        self._lock = threading.Lock()

    def poll(self) -> None:
        for name, url, metric, deadline in self._targets:
            try:
                scraped = Exchange(url, Limits(deadline), (f"{metric}_bucket",), accept=ACCEPT).run()
            except ReadingError:
                # An unreachable or refused target costs its exemplars only; its latency source reports why.
                continue
            found = parse_exemplars(scraped.text, f"{metric}_bucket", self._clock())
            with self._lock:
                kept = self._kept[name]
                seen = {e.trace_id for e in kept}
                kept.extend(e for e in found if e.trace_id not in seen)

    def trace_ids(self, target: str, since: float, until: float | None, n: int = 5) -> list[str]:
        """The slowest `n` exemplars seen between `since` and `until` (None: now), slowest first."""
        end = self._clock() if until is None else until
        with self._lock:
            kept = list(self._kept.get(target.split("#")[0], ()))
        chosen = sorted((e for e in kept if since <= e.at <= end), key=lambda e: -e.value_seconds)
        return [e.trace_id for e in chosen[:n]]
