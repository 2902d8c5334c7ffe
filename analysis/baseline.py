"""A target's baseline: the last healthy windows' compact rows, their signal statistics and pooled Python profile."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field

import msgspec

from analysis.attribution import SignalStats
from analysis.cause_signals import read_all
from analysis.features import Features
from analysis.latency_model import Row
from analysis.profile import jensen_shannon, jensen_shannon_of_share, merge
from analysis.robust import finite, mad_sigma, median, quantile
from analysis.sampling import jsd_noise
from analysis.stall_events import read_counts


def jsd_size(leaves: dict[str, float], span: int = 1) -> int:
    """How many samples a profile shift of `leaves` from a recording of `span` windows is read at: one window's
    share of them (Baseline.jsd), at least one."""
    return max(1, round(sum(leaves.values()) / max(span, 1)))


@dataclass(frozen=True)
class BaselineRow:
    """What the baseline keeps of one healthy window (small, JSON-friendly)."""

    start: float
    end: float
    latency: Row
    signals: dict[str, float | None] = field(default_factory=dict)
    jsd: float | None = None

    def to_dict(self) -> dict:
        """Strict JSON (no Infinity): the +Inf bucket bound is written as the string "+Inf", as in a Window."""
        d = asdict(self)
        d["latency"]["buckets"] = [["+Inf" if math.isinf(u) else u, c] for u, c in self.latency.buckets]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BaselineRow:
        """The inverse of to_dict, by msgspec (a ValueError names a field that does not fit); the "+Inf" bound
        to_dict writes is the one value it does not read as a number, so it is turned back first."""
        latency = d["latency"]
        buckets = [(float(u), c) for u, c in latency.get("buckets", ())]
        return msgspec.convert({**d, "latency": {**latency, "buckets": buckets}}, cls)


def trim(buckets: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """The buckets from the one before the first non-empty (its bound is that one's lower edge) to the last
    non-empty: the same exceedance counts in a third of the space."""
    filled = [i for i, (_, c) in enumerate(buckets) if c > 0]
    if not filled:
        return ()
    return buckets[max(0, filled[0] - 1): filled[-1] + 1]


def latency_row(f: Features) -> Row:
    return Row(n=f.requests or 0.0, rate=f.request_rate, tpr=f.tokens_per_request, mean=f.mean_seconds,
               p50=f.p50_seconds, p99=f.p99_seconds, buckets=trim(f.buckets), cpu_wait=cpu_wait(f))


def cpu_wait(f: Features) -> float | None:
    """Run-queue seconds per request (Little's law), None where the run queue or the request rate is unknown."""
    if f.runqueue_per_second is None or not f.request_rate:
        return None
    return f.runqueue_per_second / f.request_rate


def stats_of(xs: list[float], high_quantile: float) -> SignalStats | None:
    """A signal's baseline over the values that measured it: median, MAD-sigma, count, high quantile; None for
    fewer than 3."""
    if len(xs) < 3:
        return None
    return SignalStats(median(xs), mad_sigma(xs), len(xs), quantile(xs, high_quantile), sum(xs) / len(xs))


class Baseline:
    """Rows of healthy windows, oldest dropped past max_rows; the profile is an exponentially decayed leaf count."""

    def __init__(self, max_rows: int, profile_decay: float, high_quantile: float = 0.9) -> None:
        self.rows: deque[BaselineRow] = deque(maxlen=max_rows)
        self.profile: dict[str, float] = {}
        self.profile_decay = profile_decay
        self.high_quantile = high_quantile
        self._stats: dict[str, SignalStats | None] | None = None
        self.version = 0  # counts the profile's changes (jsd_noise's cache)
        # Healthy samples on functions the profile did not hold yet, and all healthy samples, decayed as the profile.
        self.new_samples = 0.0
        self.all_samples = 0.0
        self._noise_key: tuple | None = None
        self._noise: float | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def jsd(self, leaves: dict[str, float] | None, span: int = 1) -> float | None:
        """The profile shift of `leaves` from a recording that spanned `span` windows, as one window's share of its
        samples would read it: the shift's baseline and its gates then mean the same whatever the recording's
        length (analysis.profile.jensen_shannon_of_share)."""
        if not leaves or not self.profile:
            return None
        if span > 1:
            return jensen_shannon_of_share(self.profile, leaves, jsd_size(leaves, span))
        return jensen_shannon(self.profile, leaves)

    def jsd_noise(self, size: int, min_z: float) -> float | None:
        """What `size` samples drawn from the profile itself read against it (analysis.sampling.jsd_noise), cached
        until the profile changes."""
        key = (self.version, size, min_z)
        if self._noise_key != key:
            self._noise_key, self._noise = key, jsd_noise(self.profile, size, min_z, self.unseen)
        return self._noise

    @property
    def unseen(self) -> float:
        """The share of healthy samples that fell on functions the profile did not hold yet (0 before any)."""
        return self.new_samples / self.all_samples if self.all_samples > 0 else 0.0

    def row(self, start: float, end: float, features: Features, leaves: dict[str, float] | None,
            span: int = 1) -> BaselineRow:
        """The row a window would add (its profile shift measured against the profile as it is now)."""
        # The stall events' counts ride with the signals (analysis/stall_events.py): the test sums them over rows.
        return BaselineRow(start=start, end=end, latency=latency_row(features),
                           signals={**read_all(features), **read_counts(features)}, jsd=self.jsd(leaves, span))

    def add(self, start: float, end: float, features: Features, leaves: dict[str, float] | None,
            span: int = 1) -> None:
        self.add_row(self.row(start, end, features, leaves, span), leaves)

    def add_row(self, row: BaselineRow, leaves: dict[str, float] | None) -> None:
        self.rows.append(row)
        if leaves:
            if self.profile:  # the first window's functions are all new: no profile to be new to
                self.new_samples = self.new_samples * self.profile_decay + sum(
                    v for k, v in leaves.items() if k not in self.profile)
                self.all_samples = self.all_samples * self.profile_decay + sum(leaves.values())
            merge(self.profile, leaves, self.profile_decay)
            self.version += 1
        self._stats = None

    @property
    def start(self) -> float | None:
        return self.rows[0].start if self.rows else None

    @property
    def end(self) -> float | None:
        return self.rows[-1].end if self.rows else None

    def latency_rows(self) -> list[Row]:
        return [r.latency for r in self.rows]

    def stats(self) -> dict[str, SignalStats | None]:
        """Per signal (and 'jsd'): median, MAD-sigma and high quantile over the rows that measured it; None when fewer
        than 3 did."""
        if self._stats is None:
            names = {k for r in self.rows for k in r.signals} | {"jsd"}
            out: dict[str, SignalStats | None] = {}
            for name in names:
                xs = finite(r.jsd if name == "jsd" else r.signals.get(name) for r in self.rows)
                out[name] = stats_of(xs, self.high_quantile)
            self._stats = out
        return self._stats

    def to_dict(self) -> dict:
        return {"rows": [r.to_dict() for r in self.rows], "profile": dict(self.profile),
                "samples": [self.new_samples, self.all_samples]}

    def load(self, d: dict) -> None:
        self.rows.clear()
        self.rows.extend(BaselineRow.from_dict(r) for r in d.get("rows", []))
        self.profile = {str(k): float(v) for k, v in d.get("profile", {}).items()}
        self.new_samples, self.all_samples = (float(x) for x in d.get("samples", (0.0, 0.0)))
        self.version += 1
        self._stats = None

    def clear(self) -> None:
        self.rows.clear()
        self.profile = {}
        self.new_samples = self.all_samples = 0.0
        self.version += 1
        self._stats = None
