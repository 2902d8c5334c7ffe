"""The clients' latency given the server's own: how far the network's part of it rose, against its own baseline.

The clients wait the server's latency plus the network's part (a reply's delivery, a connection's SYN-ACK
retransmits before the request: probes/delivery.py). Both are measured in the same window, so the clients'
latency need not be judged against the server's noise: with the server's part known, what is left to judge is the
network's part, whose healthy spread is its own (milliseconds on a LAN) and not the host's. On a shared host whose
server latency swung by x4 between normal windows, 1 s SYN-ACK waits on 10-15 % of the requests raised the clients'
mean by about half the expected latency and no window's clients' score passed the open bar; this figure did from
the fault's second window (docs/detector.md "The clients' latency").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from analysis.cause_signals import BY_NAME, SIGNALS, tail_center, tail_sigma

if TYPE_CHECKING:
    from analysis.attribution import Attributor, SignalStats

# The network's part per request: a reply's mean delivery time, the SYN-ACK waits and the late first requests
# (a lost request resent) spread over the requests.
PARTS = ("delivery_mean", "connect_wait", "request_wait")
# The delivery probe's own signals (probes/delivery.py): each reply's wait for its ACK, its retransmits and RTO
# stalls, each connection's wait for a resent SYN-ACK. Not the first request's wait: a client that connects a
# moment ahead of use reads like a resent request, so it adds to the network's part (two anomalous windows of three
# still needed) but never opens a regression from one window (docs/detector.md "The first request's wait").
INDIRECT = ("request_wait",)
# Judged as a count of discrete events against the baseline's rate of them (analysis/stall_events.py), not as a ratio
# of means: a connection that waited for a resent SYN-ACK waited 1 s or more, and healthy windows have none, so how
# many did among how many is the question (a ratio of per-request means over a 10 ms floor reads one such connection
# in five requests as x20, and three in twenty-one as x14).
COUNTED = ("connect_wait",)
DIRECT = tuple(s for s in SIGNALS if s.source == "delivery" and s.name not in INDIRECT + COUNTED)


def reference(name: str, base: SignalStats) -> float:
    """Where a part's rise is measured from: its baseline's median, or its high quantile for a heavy-tailed one (the
    first request's wait: a client that connects ahead of use as its habit spreads it over 0.2-3.5 s on a varying
    share of its connections, a tail the median and MAD-sigma do not describe; cause_signals.tail_center)."""
    return tail_center(BY_NAME[name], base.median, base.high)


def spread_of(name: str, base: SignalStats) -> float:
    return tail_sigma(BY_NAME[name], base.median, base.sigma, base.high)


def network_z(values: Mapping[str, float | None], stats: Mapping[str, SignalStats | None], expected_mean: float,
              min_scale: float) -> float | None:
    """The rise of the network's part per request above the baseline's median, in units of the expected latency,
    over the baseline's own spread of that part (the parts' MAD-sigmas summed, relative to the expected latency)
    floored at `min_scale`, the smallest relative change the mean test trusts. None where delivery was not
    measured here or in the baseline (the first request's wait may be missing: it is left out)."""
    if expected_mean <= 0:
        return None
    rise = spread = 0.0
    for name in PARTS:
        now, base = values.get(name), stats.get(name)
        if now is None or base is None:
            if name in INDIRECT:
                continue  # not measured here (older recordings): the other parts still are
            return None
        rise += now - reference(name, base)
        spread += spread_of(name, base)
    return rise / expected_mean / max(spread / expected_mean, min_scale)


def direct_strength(values: Mapping[str, float | None], stats: Mapping[str, SignalStats | None],
                    attributor: Attributor) -> float:
    """The largest move (log2 of the ratio to the baseline) among the signals the delivery probe measures per reply
    and per connection, the clients' wait itself rather than a count that may cost them nothing; 0 when none passed
    the attribution gates."""
    best = 0.0
    for sig in DIRECT:
        if (m := attributor.moved(sig, values.get(sig.name), stats.get(sig.name))) is not None:
            best = max(best, m.score)
    return best
