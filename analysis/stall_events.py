"""Discrete stall events counted against the baseline's rate of them (docs/detector.md "Stall events, counted").

Some of what the server's kernel measures are events, not levels: a connection that waited for a resent SYN-ACK
(probes/delivery.py "Connection setup") waited a SYN-ACK timeout, 1 s or more, while healthy windows have none. A
ratio of per-request means against a fixed floor reads the count badly: one such connection in a window of five
requests is x20 over a 10 ms floor, three in twenty-one x14. Counted, the same window asks a sharper question: how
likely are k such connections among this window's n, given that the baseline's windows had K among N?

Each connection is a trial with an unknown per-trial rate; the baseline's K of N give it a Gamma(K + 1/2, N)
posterior (Jeffreys' prior for a Poisson rate), and the window's count of n trials then follows a negative binomial
with r = K + 1/2 and success probability N / (N + n). Its upper tail P(X >= k) is the chance that a healthy window
shows k or more: it already widens for a short baseline (few trials say little about a rate), so no separate
minimum of baseline windows is needed. The test assumes events independent across connections; a cluster (one
host hiccup delaying many handshakes at once) breaks that, which is why the detector still asks the network's part
of the latency for its own magnitude beside it (LatencyDetector._decisive).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from analysis.features import Features

# (events, trials) per window: connections that waited for a resent SYN-ACK, of the handshakes completed.
EVENTS: tuple[tuple[str, str], ...] = (("slow_connects", "connects"),)


def read_counts(f: Features) -> dict[str, float | None]:
    """The window's event and trial counts (None where the delivery probe did not measure them)."""
    return {"slow_connects": f.slow_connects, "connects": f.connects}


def baseline_counts(rows: Iterable[Mapping[str, float | None]], events: str, trials: str) -> tuple[float, float]:
    """(K, N): the events and trials summed over the baseline rows that measured both."""
    k = n = 0.0
    for signals in rows:
        e, t = signals.get(events), signals.get(trials)
        if e is None or t is None or not (math.isfinite(e) and math.isfinite(t)) or t < 0 or e < 0:
            continue
        k += e
        n += t
    return k, n


def tail(k: int, n: float, base_events: float, base_trials: float) -> float:
    """P(X >= k) for the count X of a window of n trials, under the baseline's K events in N trials (the negative
    binomial predictive above). 1 for k <= 0; 1 when the baseline has no trials (it says nothing of the rate)."""
    if k <= 0 or n <= 0:
        return 1.0
    if base_trials <= 0:
        return 1.0
    # Imported here: scipy.stats loads with scikit-learn at the detector's first fit, never at the agent's start-up.
    from scipy.stats import nbinom

    return float(min(nbinom.sf(k - 1, base_events + 0.5, base_trials / (base_trials + n)), 1.0))
