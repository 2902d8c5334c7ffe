"""Robust location and scale (median, MAD) with floors, the statistics every baseline comparison uses."""

from __future__ import annotations

import math
from collections.abc import Iterable

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


def median(values: Iterable[float]) -> float:
    xs = sorted(values)
    if not xs:
        raise ValueError("median of no values")
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def mad_sigma(values: Iterable[float], center: float | None = None) -> float:
    """MAD scaled to a standard deviation."""
    xs = list(values)
    c = median(xs) if center is None else center
    return MAD_TO_SIGMA * median(abs(x - c) for x in xs)


def quantile(values: Iterable[float], q: float) -> float:
    """The q-quantile, interpolated linearly between order statistics (numpy's default)."""
    xs = sorted(values)
    if not xs:
        raise ValueError("quantile of no values")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def robust_z(value: float, center: float, sigma: float, sigma_floor: float) -> float:
    """(value - center) / sigma, with sigma floored so a flat baseline does not turn noise into huge scores."""
    return (value - center) / max(sigma, sigma_floor)


def finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]
