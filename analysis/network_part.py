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

if TYPE_CHECKING:
    from analysis.attribution import SignalStats

# The network's part per request: a reply's mean delivery time, and the SYN-ACK waits spread over the requests.
PARTS = ("delivery_mean", "connect_wait")


def network_z(values: Mapping[str, float | None], stats: Mapping[str, SignalStats | None], expected_mean: float,
              min_scale: float) -> float | None:
    """The rise of the network's part per request above the baseline's median, in units of the expected latency,
    over the baseline's own spread of that part (the parts' MAD-sigmas summed, relative to the expected latency)
    floored at `min_scale`, the smallest relative change the mean test trusts. None where delivery was not
    measured here or in the baseline."""
    if expected_mean <= 0:
        return None
    rise = spread = 0.0
    for name in PARTS:
        now, base = values.get(name), stats.get(name)
        if now is None or base is None:
            return None
        rise += now - base.median
        spread += base.sigma
    return rise / expected_mean / max(spread / expected_mean, min_scale)
