"""Sampling noise of the signals read from py-spy's ticks: a share of a few ticks is judged against the noise of
so few, not as if it were exact.

py-spy reads every thread at each tick, and the lock signal (`app_wait`) is the count of thread-ticks spent waiting
inside the server's own code over the recording's ticks. A steady recording holds rate x seconds ticks (45 at 3 Hz
over 15 s, 15 at 1 Hz): healthy traffic then counts 0-4 such waits, and a share of 3 waits in 15 ticks (0.2
threads) passes the signal's gates (0.2 threads above a median of 0) as 9 waits in 45 would, though at a healthy
0.024 waits per tick it happens by chance 0.6 % of the time against 0.0002 %. The baseline's MAD cannot see that: with most windows counting 0 its median and MAD are 0, and
more so at fewer ticks (a share of n ticks is 0 with probability exp(-rate x n)).

So a count-based signal must also be improbable under the baseline's own rate at the ticks it was read from: with
the baseline's mean count per tick as the rate (the mean, not the median: the median of sparse counts is 0), the
count x ticks, and a Poisson tail (waits of several threads add up; a thread's waits are at most as spread as
Poisson's), at the attribution's z (p <= the normal tail beyond min_z: 0.00135 at z 3). Over a run of windows,
the recordings behind them are pooled once each (a recording spanning three windows is one measurement, not
three), so persistence over several recordings adds evidence that one recording cannot give.

A Python profile shift (Jensen-Shannon divergence of a window's active leaves from the baseline's profile) from a
few samples reads high by chance alone (one sample reads ~1 bit against a spread profile; two samples on functions
the profile has not seen read 1.0, as a whole new profile would). `jsd_noise` is what healthy traffic's samples of
the same size read: drawn from the baseline profile, each falling on a function new to it as often as healthy
samples did; its mean plus min_z of its spread, seeded. The shift must exceed it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from statistics import NormalDist

import numpy as np

# Where a recording's ticks and identity are kept in the detector's per-window values.
TICKS = "{}_ticks"
EVENTS = "{}_events"
RECORDINGS = "{}_recordings"
FROM = "stacks_from"


def poisson_sf(k: float, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(mu), k rounded up to a whole count; 1.0 where k <= mu (never significant here)."""
    k = math.ceil(k - 1e-9)
    if k <= 0:
        return 1.0
    if mu <= 0:
        return 0.0
    if k <= mu:
        return 1.0
    # Imported here: scipy.stats loads with scikit-learn at the detector's first fit, never at the agent's start-up.
    from scipy.stats import poisson

    return float(min(poisson.sf(k - 1, mu), 1.0))


def tail_p(z: float) -> float:
    """The one-sided normal tail beyond z: the chance level a z gate stands for."""
    return NormalDist().cdf(-z)


def noise_sigma(rate: float, ticks: float) -> float:
    """The spread of one recording's share of `ticks` ticks at `rate` events per tick (Poisson): the spread the
    baseline's MAD-sigma stands for, which it cannot show for sparse counts (0 where most recordings count 0)."""
    return math.sqrt(max(rate, 0.0) / ticks) if ticks > 0 else 0.0


def beyond_noise(events: float, ticks: float, rate: float, min_z: float) -> bool:
    """Whether `events` counted over `ticks` ticks lie beyond what the baseline's `rate` per tick gives by chance at
    the level of a z of min_z (module docstring)."""
    if ticks <= 0:
        return True  # no tick count: nothing to judge it by (as before)
    return poisson_sf(events, max(rate, 0.0) * ticks) <= tail_p(min_z)


def counts(name: str, values: Mapping[str, object]) -> tuple[float, float, int] | None:
    """(events, ticks, recordings) of a per-tick signal in one window's values: the window's own recording or the
    carried one's (one recording, or as many as a caller pooled: EVENTS, RECORDINGS); None where the ticks are unknown
    (a family's sum, older state)."""
    ticks, value = values.get(TICKS.format(name)), values.get(name)
    if not isinstance(ticks, (int, float)) or not isinstance(value, (int, float)) or ticks <= 0:
        return None
    events, recordings = values.get(EVENTS.format(name)), values.get(RECORDINGS.format(name))
    return ((float(events) if isinstance(events, (int, float)) else float(value) * float(ticks)), float(ticks),
            int(recordings) if isinstance(recordings, int) and recordings > 0 else 1)


def pooled(name: str, samples: Sequence[Mapping[str, object]]) -> tuple[float, float, int] | None:
    """(events, ticks, recordings) of a per-tick signal over a run of windows, each recording counted once (windows
    that carry one recording's reading share its `stacks_from`); None where no window has a tick count."""
    seen: dict[object, tuple[float, float, int]] = {}
    for i, v in enumerate(samples):
        c = counts(name, v)
        if c is None:
            continue
        seen[v.get(FROM, ("window", i))] = c
    if not seen:
        return None
    return sum(c[0] for c in seen.values()), sum(c[1] for c in seen.values()), len(seen)


def jsd_noise(profile: Mapping[str, float], size: int, min_z: float, unseen: float = 0.0,
              draws: int = 200) -> float | None:
    """The Jensen-Shannon divergence (bits) that `size` samples of healthy traffic read against `profile`: mean plus
    min_z of its spread over `draws` seeded draws, at most 1 (a single sample can show no shift); None for an empty
    profile or size. Each sample falls, with probability `unseen`, on a function the profile does not hold (the
    share of healthy samples that did so, Baseline.unseen: a profile learnt from few samples lacks many functions
    healthy traffic runs), counted as a new function of its own (the most a sample can add); else it is drawn
    from the profile."""
    keys = sorted(k for k, v in profile.items() if v > 0)
    if not keys or size <= 0:
        return None
    p = np.array([profile[k] for k in keys], dtype=float)
    p /= p.sum()
    rng = np.random.default_rng([size, len(keys), zlib.crc32(keys[0].encode())])
    new = rng.binomial(size, min(max(unseen, 0.0), 1.0), size=draws)
    q = rng.multinomial(size - new, p) / float(size)
    m = (q + p) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(q > 0, q * np.log2(q / m), 0.0)
        b = p * np.log2(p / m)
    # A new function's share 1/size against none in the profile adds 1/(2 size) bits.
    js = np.clip(0.5 * (a.sum(axis=1) + b.sum(axis=1) + new / float(size)), 0.0, 1.0)
    return min(float(js.mean() + min_z * js.std()), 1.0)
