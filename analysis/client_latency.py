"""What the clients wait, estimated per window: the server's latency plus the reply's delivery time.

The server's latency histogram (its own /metrics: arrival to the reply written) and the delivery histogram
(probes/delivery.py: reply written to the client's ACK) share bucket bounds. A request's client-side latency
is the sum of its two parts; the two are not paired request by request, so the estimate takes them as
independent: each histogram is read at 200 evenly spaced ranks (PromQL's linear interpolation within a
bucket), every pair is summed, and the sums' quantiles are the estimate. Network delay does not depend on
how long the model ran, which is what makes independence fair; a fault that slows both at once (a saturated
host) makes the estimate a little narrower than the truth. A connection whose SYN-ACK was retransmitted delayed
the first request sent on it: the share of requests equal to the window's slow connections per request get their
mean wait added (docs/delivery.md "Connection setup").

What it cannot see (docs/detector.md): time before the request reached the server's kernel (connection
setup beyond resent SYN-ACKs, the request's own loss, a client's queue), stalls in the client after its kernel had the bytes,
proxies or load balancers in between (the "client" is then the proxy), and TLS terminated elsewhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from analysis.window import DeliveryReading, LatencyReading

RANKS = 200
QUANTILES = (0.5, 0.95, 0.99)
# Fewer observations than this in a bucket: the estimate reads them at the bucket's least-relative-error point, not
# spread linearly (bucket_quantiles; docs/BENCHMARKS.md "Network scenarios, recorded live").
SPARSE = 3


@dataclass(frozen=True)
class ClientLatency:
    p50_seconds: float
    p95_seconds: float
    p99_seconds: float
    # Delivery's own quantiles and the share of replies retransmitted, for the evidence a cause names.
    delivery_p99_seconds: float
    retransmitted_share: float


def _bound(key: str) -> float:
    return math.inf if key == "+Inf" else float(key)


def bucket_quantiles(buckets: dict[str, float], qs: np.ndarray, sparse: float = 0.0,
                     first_upper: float | None = None) -> np.ndarray | None:
    """Values at ranks `qs` of a histogram {upper bound: count} (not cumulative), interpolated linearly within a
    bucket from its lower bound (0 for the first); ranks in +Inf take the last finite bound. None when empty.

    A bucket holding fewer than `sparse` observations (lower bound above 0) puts its ranks at the point of least
    worst-case relative error, 2·lo·hi / (lo + hi): one or two requests in it say nothing of where they lie, and
    linear interpolation places the slowest of a window's ~20 requests (its nearest-rank p99) near the upper bound.
    With `sparse` set, a bucket above 0 of k >= `sparse` observations puts its j-th at j/(k+1) of its width (the expected
    place of the j-th of k uniform draws, Weibull's plotting position), not at j/k: a linear read puts the slowest of
    the bucket at its upper bound, where the largest of k draws seldom lies (at ~20 requests that one is the
    window's nearest-rank p99; docs/BENCHMARKS.md "Network scenarios, recorded live")."""
    keys = sorted(buckets, key=_bound)
    bounds = [_bound(k) for k in keys]
    counts = np.array([max(0.0, buckets[k]) for k in keys], dtype=float)
    total = counts.sum()
    if total <= 0:
        return None
    finite = [b for b in bounds if b != math.inf]
    cum = np.cumsum(counts)
    out = np.empty(len(qs))
    for i, q in enumerate(qs):
        rank = q * total
        b = int(np.searchsorted(cum, rank, side="left"))
        b = min(b, len(bounds) - 1)
        if bounds[b] == math.inf:
            out[i] = finite[-1] if finite else 0.0
            continue
        lo = bounds[b - 1] if b else 0.0
        below = cum[b - 1] if b else 0.0
        inside = counts[b]
        if b == 0 and first_upper is not None:
            out[i] = min(first_upper, bounds[0]) * ((rank / inside) if inside > 0 else 1.0)
            continue
        if 0 < inside < sparse and lo > 0:
            out[i] = 2 * lo * bounds[b] / (lo + bounds[b])
            continue
        spread = inside + 1 if sparse and lo > 0 else inside  # Weibull's j/(k+1) for the estimate; else PromQL's j/k
        out[i] = lo + (bounds[b] - lo) * ((rank - below) / spread if inside > 0 else 1.0)
    return out


def late_requests(delivery: DeliveryReading) -> tuple[int, float]:
    """(fresh connections whose first request arrived late after the handshake, their waits summed), counted only in
    a window in which the server's own sockets also resent something: a path that lost a request loses the clients'
    ACKs too, and the server resends for those, while a client that connected ahead of use costs nobody a resend
    (docs/delivery.md "The first request"). (0, 0) where not measured."""
    if delivery.first_requests is None or delivery.retransmits <= 0:
        return 0, 0.0
    return delivery.late_requests, delivery.request_wait_seconds


def connect_wait(delivery: DeliveryReading | None, requests: float, late: bool = True) -> tuple[float, float]:
    """(share of requests that waited before reaching the server, their mean wait in seconds): a connection that
    waited for a SYN-ACK retransmit, or whose first request arrived late after the handshake (a lost request the
    client resent, late_requests), delays the first request sent on it, so the share is such waits per request (at most 1).
    (0, 0) when none waited or nothing was served. late=False leaves the late first requests out (the detector judges
    them apart, against their own heavy-tailed baseline: analysis/network_part.py)."""
    if delivery is None or requests <= 0:
        return 0.0, 0.0
    n_late, late_wait = late_requests(delivery) if late else (0, 0.0)
    waits = delivery.slow_connects + n_late
    if waits <= 0:
        return 0.0, 0.0
    return min(1.0, waits / requests), (delivery.connect_wait_seconds + late_wait) / waits


def _samples(server: np.ndarray, network: np.ndarray, slow: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    """The clients' waits as weighted samples: every pair's sum, and the same sums plus the mean connect wait for
    the share of requests that had to wait for one (weights sum to 1)."""
    sums = np.add.outer(server, network).ravel()
    share, wait = slow
    w = np.full(len(sums), 1.0 / len(sums))
    if share <= 0:
        return sums, w
    return np.concatenate([sums, sums + wait]), np.concatenate([w * (1 - share), w * share])


def _weighted_quantiles(values: np.ndarray, weights: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    return [float(v[min(int(np.searchsorted(cum, q * cum[-1], side="left")), len(v) - 1)]) for q in qs]


def client_buckets(server: dict[str, float], delivery: dict[str, float],
                   slow: tuple[float, float] = (0.0, 0.0)) -> dict[str, float]:
    """The clients' latency histogram on the server's bucket bounds: the server's count of requests spread as the
    independent sums of both histograms' RANKS evenly spaced values fall, `slow` (connect_wait) added to its share.
    {} when either is empty."""
    qs = (np.arange(RANKS) + 0.5) / RANKS
    a, b = bucket_quantiles(server, qs), bucket_quantiles(delivery, qs)
    if a is None or b is None:
        return {}
    keys = sorted(server, key=_bound)
    bounds = np.array([_bound(k) for k in keys])
    sums, weights = _samples(a, b, slow)
    idx = np.minimum(np.searchsorted(bounds, sums, side="left"), len(bounds) - 1)
    n = sum(max(0.0, v) for v in server.values())
    counts = np.bincount(idx, weights=weights, minlength=len(bounds)) * n
    return {k: float(c) for k, c in zip(keys, counts, strict=True)}


def _first_upper(delivery: DeliveryReading) -> float | None:
    """Where the delivery histogram's first bucket (from 0) ends in effect: twice the most its replies can average
    given the measured sum (every later reply at least its bucket's lower bound), so that a uniform read of the
    bucket keeps the measured mean: on a LAN replies take ~0.1 ms, and a linear read of the 0-10 ms bucket put up to
    10 ms on each. None when unknown."""
    keys = sorted(delivery.buckets, key=_bound)
    if not keys or delivery.delivery_seconds <= 0:
        return None
    first = max(0.0, delivery.buckets[keys[0]])
    if first <= 0:
        return None
    later = sum(_bound(a) * max(0.0, delivery.buckets[b]) for a, b in zip(keys, keys[1:], strict=False))
    return 2 * max(0.0, delivery.delivery_seconds - later) / first


def estimate(latency: LatencyReading | None, delivery: DeliveryReading | None) -> ClientLatency | None:
    """The clients' p50/p95/p99 for a window; None unless both histograms have observations."""
    if latency is None or delivery is None or not latency.buckets or not delivery.buckets or not delivery.replies:
        return None
    qs = (np.arange(RANKS) + 0.5) / RANKS
    server = bucket_quantiles(latency.buckets, qs, SPARSE)
    network = bucket_quantiles(delivery.buckets, qs, SPARSE, _first_upper(delivery))
    if server is None or network is None:
        return None
    requests = sum(max(0.0, v) for v in latency.buckets.values())
    sums, weights = _samples(server, network, connect_wait(delivery, requests))
    p50, p95, p99 = _weighted_quantiles(sums, weights, QUANTILES)
    return ClientLatency(p50_seconds=p50, p95_seconds=p95, p99_seconds=p99,
                         delivery_p99_seconds=float(np.quantile(network, 0.99)),
                         retransmitted_share=delivery.retransmitted / delivery.replies)
